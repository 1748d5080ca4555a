import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { cpus, platform, arch, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sql } from 'slonik';
import { z } from 'zod';
import { createDatabasePool } from '../src/db/pool.js';
import { silentLogger } from '../src/log/logger.js';
import { resumePushConfig } from '../src/push/push-admin.js';
import { KeelQueues, type QueueBackend } from '../src/queue/keel-queues.js';
import { encodeMasterKey, generateMasterKey } from '../src/sealing/master-key.js';
import { fmt, percentile, withBenchDatabase } from './support.js';

// bench:push — push notifications from a Keel child process (`node bin/keel.js start`) to a local
// HTTP receiver in this process. 100 tasks, each with one push config, each emitting 100 journal
// events (WORKING, 97 artifacts from a scripted agent, the answer's artifact, COMPLETED): 10,000
// deliveries. Two modes, each on a fresh database:
//   live   the receiver answers 200 while the agents run: deliveries per second from the first
//          event's commit to the last receipt, and the delay of each delivery from its event's
//          commit (a2a_events.created_at) to its receipt, p50 and p99;
//   drain  the receiver first answers 401, so every config pauses while all 10,000 events are
//          journaled; then it answers 200 and every config is resumed at once: deliveries per
//          second of a full outbox (the push pipeline alone, nothing else running);
//   hung   drain, with BENCH_PUSH_HUNG_TASKS more tasks whose configs point at
//          BENCH_PUSH_HUNG_DESTINATIONS receivers that accept and never answer (each its own port):
//          the healthy configs' deliveries per second as a share of drain's (push isolation,
//          docs/push.md "Isolation"; the goal is at least 80 %). Runs drain first if it is not asked.
//          The receivers hang for the whole run; it prints Keel's push settings, the hung requests
//          made during the measured window and the hung destinations' breakers at the resume and end.
// Prints figures; asserts nothing, except that every event was delivered, in order per config.
//
// Environment:
//   BENCH_PUSH_CONFIGS       configs (= tasks) (100)
//   BENCH_PUSH_EVENTS        events in total, spread evenly over the configs (10000)
//   BENCH_PUSH_MODES         live,drain,hung (all three)
//   BENCH_PUSH_HUNG_TASKS    tasks pushing to hung receivers in hung mode (48)
//   BENCH_PUSH_HUNG_DESTINATIONS  hung receivers in hung mode (2)
//   BENCH_PUSH_CONCURRENCY   KEEL_PUSH_CONCURRENCY of the Keel child (Keel's default, 16)
//   BENCH_KEEL_QUEUE         redis | postgres (redis; Redis at BENCH_REDIS_URL, redis://127.0.0.1:6379)
//   BENCH_KEEL_LOG_LEVEL     KEEL_LOG_LEVEL of the Keel child (warn)
//   KEEL_BENCH_ADMIN_URL     Postgres admin URL (bench/support.ts)

const repoRoot = fileURLToPath(new URL('..', import.meta.url));
const toolsModule = fileURLToPath(new URL('../test/fixtures/test-tools.ts', import.meta.url));

function fail(message: string): never {
  console.error(`bench:push: ${message}`);
  process.exit(2);
}
function positiveInteger(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 1) fail(`${name}: expected a positive integer, got "${raw}"`);
  return value;
}

const configs = positiveInteger('BENCH_PUSH_CONFIGS', 100);
const totalEvents = positiveInteger('BENCH_PUSH_EVENTS', 10_000);
const eventsPerTask = Math.floor(totalEvents / configs);
if (eventsPerTask < 4) fail('BENCH_PUSH_EVENTS must give every config at least 4 events');
const artifactSteps = eventsPerTask - 3;
type Mode = 'live' | 'drain' | 'hung';
const modes = (process.env.BENCH_PUSH_MODES ?? 'live,drain,hung').split(',').map((mode) => mode.trim()) as Mode[];
for (const mode of modes) if (mode !== 'live' && mode !== 'drain' && mode !== 'hung') fail(`BENCH_PUSH_MODES: unknown mode "${mode}"`);
// hung is read as a share of drain: drain runs first when only hung is asked.
if (modes.includes('hung') && !modes.includes('drain')) modes.splice(modes.indexOf('hung'), 0, 'drain');
const hungTasks = positiveInteger('BENCH_PUSH_HUNG_TASKS', 48);
const hungDestinations = positiveInteger('BENCH_PUSH_HUNG_DESTINATIONS', 2);
const pushConcurrency = process.env.BENCH_PUSH_CONCURRENCY;
const keelQueue = process.env.BENCH_KEEL_QUEUE ?? 'redis';
if (keelQueue !== 'redis' && keelQueue !== 'postgres') fail(`BENCH_KEEL_QUEUE: expected redis or postgres, got "${keelQueue}"`);
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// The receiver.

type Receipt = { deliveryId: string; at: number; status: number };

function startReceiver(answer: () => number): Promise<{ server: Server; url: string; receipts: Receipt[] }> {
  const receipts: Receipt[] = [];
  const server = createHttpServer((request, response) => {
    request.resume();
    request.on('end', () => {
      const status = answer();
      receipts.push({ deliveryId: String(request.headers['x-keel-delivery-id'] ?? ''), at: Date.now(), status });
      response.writeHead(status, { 'content-type': 'text/plain' });
      response.end();
    });
  });
  server.keepAliveTimeout = 10_000;
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const port = (server.address() as AddressInfo).port;
      resolve({ server, url: `http://127.0.0.1:${port}/hook`, receipts });
    });
  });
}

/** A receiver that accepts every connection and request and never answers. */
function startHungReceiver(): Promise<{ server: Server; url: string; port: number; requests: () => number }> {
  let requests = 0;
  const server = createHttpServer((request) => {
    request.resume();
    request.on('end', () => {
      requests += 1;
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const port = (server.address() as AddressInfo).port;
      resolve({ server, url: `http://127.0.0.1:${port}/hook`, port, requests: () => requests });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// The Keel child.

async function freePort(): Promise<number> {
  const server = createHttpServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

type KeelChild = { process: ChildProcess; origin: string; prefix: string; tail: () => string; stop: () => Promise<void> };

async function startKeelChild(databaseUrl: string, dataDir: string): Promise<KeelChild> {
  const configFile = join(dataDir, 'bench.config.yaml');
  writeFileSync(configFile, '# bench:push: everything comes from the environment\n');
  const port = await freePort();
  const prefix = `benchpush${randomBytes(4).toString('hex')}`;
  const steps = [
    ...Array.from({ length: artifactSteps }, (_, index) => ({
      artifact: { artifactId: `part-${index + 1}`, text: `part ${index + 1}` },
      toolCalls: [{ name: 'lookup', arguments: {} }],
    })),
    { reply: 'all parts sent' },
  ];
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    KEEL_CONFIG: configFile,
    KEEL_DATABASE_URL: databaseUrl,
    KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()),
    KEEL_SERVER_HOST: '127.0.0.1',
    KEEL_SERVER_PORT: String(port),
    KEEL_DATA_DIR: dataDir,
    KEEL_AUTH_MODE: 'none',
    KEEL_QUEUE_PREFIX: prefix,
    KEEL_LOG_LEVEL: process.env.BENCH_KEEL_LOG_LEVEL ?? 'warn',
    KEEL_PRIVACY_LEVEL: 'full',
    KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
    KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
    KEEL_TOOL_MODULES: JSON.stringify([toolsModule]),
    KEEL_PROVIDERS: JSON.stringify({ burst: { type: 'scripted', steps } }),
    KEEL_AGENTS: JSON.stringify([{ id: 'burst', name: 'Burst', provider: 'burst', tools: ['lookup'], limits: { maxIterations: eventsPerTask + 10, tokenBudget: 10_000_000 } }]),
    ...(pushConcurrency ? { KEEL_PUSH_CONCURRENCY: pushConcurrency } : {}),
  };
  delete env.KEEL_QUEUE_REDIS_URL;
  if (keelQueue === 'redis') env.KEEL_QUEUE_REDIS_URL = redisUrl;
  const child = spawn(process.execPath, [join(repoRoot, 'bin/keel.js'), 'start'], { cwd: repoRoot, env, stdio: ['ignore', 'pipe', 'pipe'] });
  const output: string[] = [];
  const keep = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) output.push(line);
    while (output.length > 40) output.shift();
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const origin = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 90_000;
  for (;;) {
    if (child.exitCode !== null) fail(`Keel exited before it was ready:\n${output.join('\n')}`);
    const ok = await fetch(`${origin}/readyz`, { signal: AbortSignal.timeout(2000) }).then((response) => response.ok, () => false);
    if (ok) break;
    if (Date.now() > deadline) fail(`Keel was not ready within 90 s:\n${output.join('\n')}`);
    await sleep(250);
  }
  return {
    process: child,
    origin,
    prefix,
    tail: () => output.join('\n'),
    stop: async () => {
      if (child.exitCode === null) child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(killer);
    },
  };
}

async function dropRedisKeys(prefix: string): Promise<void> {
  if (keelQueue !== 'redis') return;
  try {
    const { Redis } = await import('ioredis');
    const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
    try {
      let cursor = '0';
      do {
        const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
        cursor = next;
        if (keys.length > 0) await redis.del(...keys);
      } while (cursor !== '0');
    } finally {
      redis.disconnect();
    }
  } catch {
    // Leftover keys under a random prefix do no harm.
  }
}

// ---------------------------------------------------------------------------------------------
// One mode.

type ModeResult = {
  mode: Mode;
  /** hung: requests the hung receivers got (each held until Keel's timeout), in all and during the measured window. */
  hungRequests?: number;
  hungRequestsInWindow?: number;
  /** hung: each hung destination's breaker state in the Keel child at the resume and at the end (its /metrics). */
  hungBreakersAtResume?: string[];
  hungBreakersAtEnd?: string[];
  events: number;
  delivered: number;
  requests: number;
  duplicates: number;
  orderViolations: number;
  /** Deliveries per second over the measured window. */
  rate: number;
  windowMs: number;
  /** live: commit → receipt; drain: resume → receipt. */
  p50: number;
  p99: number;
  max: number;
  /** live: how long the agents took to journal every event (first → last commit). */
  productionMs?: number;
};

const deliveryTiming = z.object({ id: z.string(), task_id: z.string(), config_id: z.string(), event_sequence: z.number(), state: z.string(), committed_ms: z.number() });

async function runMode(mode: Mode): Promise<ModeResult> {
  return withBenchDatabase(async (databaseUrl) => {
    const dataDir = mkdtempSync(join(tmpdir(), 'keel-bench-push-'));
    let status = mode === 'live' ? 200 : 401;
    const receiver = await startReceiver(() => status);
    const hung = mode === 'hung' ? await Promise.all(Array.from({ length: hungDestinations }, () => startHungReceiver())) : [];
    const keel = await startKeelChild(databaseUrl, dataDir);
    const pool = await createDatabasePool(databaseUrl, { maximumPoolSize: 4 });
    const backend: QueueBackend = keelQueue === 'redis' ? { kind: 'redis', url: redisUrl, prefix: keel.prefix } : { kind: 'postgres', connectionString: databaseUrl, prefix: keel.prefix };
    const queues = new KeelQueues(backend, silentLogger());
    const count = (query: ReturnType<typeof sql.fragment>) => pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM ${query}`);
    try {
      const started = Date.now();
      // The tasks, each with its push config embedded in SendMessage (returning at once).
      const taskIds: string[] = [];
      // In hung mode the hung tasks come after the healthy ones, under config id 'hung'.
      const sendTasks = mode === 'hung' ? configs + hungTasks : configs;
      for (let batch = 0; batch < sendTasks; batch += 20) {
        const sent = await Promise.all(
          Array.from({ length: Math.min(20, sendTasks - batch) }, async (_, index) => {
            const number = batch + index;
            const push = number < configs ? { id: 'bench', url: receiver.url } : { id: 'hung', url: hung[number % hung.length]!.url };
            const response = await fetch(`${keel.origin}/a2a/burst`, {
              method: 'POST',
              headers: { 'content-type': 'application/json', 'a2a-version': '1.0' },
              body: JSON.stringify({
                jsonrpc: '2.0',
                id: batch + index,
                method: 'SendMessage',
                params: {
                  message: { messageId: `bench-push-${batch + index}`, role: 'ROLE_USER', parts: [{ text: `task ${batch + index}` }] },
                  configuration: { returnImmediately: true, taskPushNotificationConfig: push },
                },
              }),
            });
            const body = (await response.json()) as { result?: { task?: { id: string } }; error?: unknown };
            if (!body.result?.task?.id) fail(`SendMessage failed: ${JSON.stringify(body)}`);
            return body.result.task.id;
          }),
        );
        taskIds.push(...sent.slice(0, Math.max(0, configs - batch)));
      }

      const expected = configs * eventsPerTask;
      const progress = async (label: string, done: () => Promise<boolean>, timeoutMs: number) => {
        const deadline = Date.now() + timeoutMs;
        while (!(await done())) {
          if (Date.now() > deadline) fail(`${mode}: timed out waiting for ${label}\n${keel.tail()}`);
          await sleep(250);
        }
      };
      let resumedAt = 0;
      let hungRequestsAtResume = 0;
      let hungBreakersAtResume: string[] = [];
      // Each hung destination's breaker as the Keel child reports it (docs/push.md, "Isolation").
      const hungBreakers = async () => {
        const text = await (await fetch(`${keel.origin}/metrics`)).text();
        return hung.map((one) => {
          const line = text.split('\n').find((candidate) => candidate.startsWith(`keel_push_destination_breaker{destination="127.0.0.1:${one.port}"`) && candidate.endsWith(' 1'));
          return /state="([a-z_]+)"/.exec(line ?? '')?.[1] ?? 'unknown';
        });
      };
      if (mode === 'drain' || mode === 'hung') {
        // Every event journaled and every config paused, then all resumed at once.
        await progress('every task to end', async () => (await count(sql.fragment`a2a_tasks WHERE state = 'TASK_STATE_COMPLETED'`)) === sendTasks, 600_000);
        await progress('every config to pause', async () => (await count(sql.fragment`push_configs WHERE state = 'paused'`)) === configs, 120_000);
        await progress('every delivery row', async () => (await count(sql.fragment`push_deliveries WHERE state = 'pending' AND config_id = 'bench'`)) >= expected, 60_000);
        if (mode === 'hung') {
          hungBreakersAtResume = await hungBreakers();
          hungRequestsAtResume = hung.reduce((sum, one) => sum + one.requests(), 0);
        }
        status = 200;
        receiver.receipts.length = 0;
        resumedAt = Date.now();
        await Promise.all(taskIds.map((taskId) => resumePushConfig({ pool, queues }, taskId, 'bench')));
      }
      await progress('every delivery', async () => (await count(sql.fragment`push_deliveries WHERE state <> 'pending' AND config_id = 'bench'`)) >= expected, 900_000);
      const finished = Date.now();
      const hungBreakersAtEnd = mode === 'hung' ? await hungBreakers() : [];

      const rows = await pool.any(sql.type(deliveryTiming)`
        SELECT d.id, d.task_id, d.config_id, d.event_sequence, d.state, (extract(epoch FROM e.created_at) * 1000)::float8 AS committed_ms
        FROM push_deliveries d JOIN a2a_events e ON e.task_id = d.task_id AND e.sequence = d.event_sequence WHERE d.config_id = 'bench'`);
      const delivered = rows.filter((row) => row.state === 'delivered');
      const acknowledged = new Map<string, number>();
      let requests = 0;
      for (const receipt of receiver.receipts) {
        requests += 1;
        if (receipt.status >= 200 && receipt.status < 300 && !acknowledged.has(receipt.deliveryId)) acknowledged.set(receipt.deliveryId, receipt.at);
      }
      const duplicates = receiver.receipts.filter((receipt) => receipt.status === 200).length - acknowledged.size;
      // Order per config: acknowledgements in event order.
      const byConfig = new Map<string, Array<{ sequence: number; at: number }>>();
      for (const row of delivered) {
        const at = acknowledged.get(row.id);
        if (at === undefined) continue;
        const key = `${row.task_id}/${row.config_id}`;
        if (!byConfig.has(key)) byConfig.set(key, []);
        byConfig.get(key)!.push({ sequence: row.event_sequence, at });
      }
      let orderViolations = 0;
      for (const list of byConfig.values()) {
        list.sort((a, b) => a.sequence - b.sequence);
        for (let i = 1; i < list.length; i += 1) if (list[i]!.at < list[i - 1]!.at) orderViolations += 1;
      }
      const from = mode === 'live' ? Math.min(...rows.map((row) => row.committed_ms)) : resumedAt;
      const lastReceipt = Math.max(...acknowledged.values());
      const delays = delivered
        .map((row) => (acknowledged.get(row.id) ?? Number.NaN) - (mode === 'live' ? row.committed_ms : resumedAt))
        .filter((value) => Number.isFinite(value))
        .sort((a, b) => a - b);
      const committed = rows.map((row) => row.committed_ms);
      void started;
      void finished;
      return {
        mode,
        events: rows.length,
        delivered: delivered.length,
        requests,
        duplicates,
        orderViolations,
        rate: (acknowledged.size / (lastReceipt - from)) * 1000,
        windowMs: lastReceipt - from,
        p50: percentile(delays, 50),
        p99: percentile(delays, 99),
        max: delays.at(-1) ?? Number.NaN,
        ...(mode === 'live' ? { productionMs: Math.max(...committed) - Math.min(...committed) } : {}),
        ...(mode === 'hung'
          ? {
              hungRequests: hung.reduce((sum, one) => sum + one.requests(), 0),
              hungRequestsInWindow: hung.reduce((sum, one) => sum + one.requests(), 0) - hungRequestsAtResume,
              hungBreakersAtResume,
              hungBreakersAtEnd,
            }
          : {}),
      };
    } finally {
      await queues.close().catch(() => undefined);
      await pool.end().catch(() => undefined);
      await keel.stop();
      await new Promise<void>((resolve) => receiver.server.close(() => resolve()));
      receiver.server.closeAllConnections();
      for (const one of hung) {
        one.server.closeAllConnections();
        await new Promise<void>((resolve) => one.server.close(() => resolve()));
      }
      await dropRedisKeys(keel.prefix);
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
}

// ---------------------------------------------------------------------------------------------

const cores = cpus();
console.log('');
console.log(`bench:push — ${configs} configs × ${eventsPerTask} events = ${configs * eventsPerTask} deliveries to a local receiver, Keel child on the ${keelQueue} queue, push concurrency ${pushConcurrency ?? '16 (default)'}`);
console.log(
  `Keel's push settings (its defaults): push.concurrency ${pushConcurrency ?? 16} slots, a destination at most push.destinationShare 0.25 of them, ` +
    `push.timeoutSeconds 15, push.connectTimeoutSeconds 5, breaker after push.breakerFailures 5 timeouts or connection failures, open for push.breakerCooldownSeconds 30` +
    (modes.includes('hung') ? `; hung mode: ${hungTasks} more tasks (${eventsPerTask} events each) pushing to ${hungDestinations} receivers that accept and never answer, for the whole run` : ''),
);
console.log(`machine: ${cores.length} cores (${cores[0]?.model.trim() ?? 'unknown CPU'}), ${fmt(totalmem() / 2 ** 30)} GiB, ${platform()} ${arch()}, node ${process.version}; ${new Date().toISOString()}`);
const results: ModeResult[] = [];
for (const mode of modes) {
  const result = await runMode(mode);
  results.push(result);
  const ok = result.delivered === result.events && result.orderViolations === 0 ? 'all delivered, in order' : `${result.delivered}/${result.events} delivered, ${result.orderViolations} order violations`;
  if (mode === 'live') {
    console.log(
      `live:  ${fmt(result.rate, 0)} deliveries/s (${result.delivered} in ${fmt(result.windowMs / 1000, 2)} s from the first commit to the last receipt; the agents took ${fmt(result.productionMs! / 1000, 2)} s to journal them); ` +
        `commit → receipt p50 ${fmt(result.p50, 0)} ms, p99 ${fmt(result.p99, 0)} ms, max ${fmt(result.max, 0)} ms; ${result.requests} requests, ${result.duplicates} duplicates; ${ok}`,
    );
  } else if (mode === 'hung') {
    const baseline = results.find((candidate) => candidate.mode === 'drain')!;
    console.log(
      `hung:  ${fmt(result.rate, 0)} deliveries/s to the healthy receiver (${result.delivered} pending deliveries of ${configs} paused configs, resumed at once, all received in ${fmt(result.windowMs / 1000, 2)} s) ` +
        `beside ${hungTasks} tasks pushing to ${hungDestinations} receivers that never answer (${result.hungRequests} requests held, ${result.hungRequestsInWindow} of them in the window; ` +
        `their breakers ${result.hungBreakersAtResume!.join('/')} at the resume, ${result.hungBreakersAtEnd!.join('/')} at the end); ` +
        `${fmt((result.rate / baseline.rate) * 100, 0)} % of drain's ${fmt(baseline.rate, 0)}/s (goal ≥ 80 %); resume → receipt p50 ${fmt(result.p50, 0)} ms, p99 ${fmt(result.p99, 0)} ms; ${ok}`,
    );
  } else {
    console.log(
      `drain: ${fmt(result.rate, 0)} deliveries/s (${result.delivered} pending deliveries of ${configs} paused configs, resumed at once, all received in ${fmt(result.windowMs / 1000, 2)} s); ` +
        `resume → receipt p50 ${fmt(result.p50, 0)} ms, p99 ${fmt(result.p99, 0)} ms; ${result.requests} requests, ${result.duplicates} duplicates; ${ok}`,
    );
  }
}
if (process.env.BENCH_JSON) writeFileSync(process.env.BENCH_JSON, JSON.stringify(results, null, 2));
process.exit(0);
