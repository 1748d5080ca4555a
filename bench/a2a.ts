import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { setMaxListeners } from 'node:events';
import { createServer } from 'node:net';
import { cpus, platform, arch, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import pg from 'pg';
import { Pool } from 'undici';
import { encodeMasterKey, generateMasterKey } from '../src/sealing/master-key.js';
import { ADMIN_URL, fmt, percentile, withBenchDatabase } from './support.js';

// bench:a2a — the same load against three A2A servers, side by side in one run on this machine:
//   - the official @a2a-js/sdk server on its InMemoryTaskStore,
//   - the same server on its Postgres DatabaseTaskStore,
//   - Keel (`node bin/keel.js start`), default echo agent, queue on Redis or Postgres.
// The load: blocking SendMessage over JSON-RPC, a new task per request, N concurrent clients, a
// warm-up, then a measured window. Every server runs in a child process of its own, one at a time,
// so neither the load generator nor another server shares its event loop. Prints figures; asserts
// nothing (DESIGN.md, Performance, gives the targets: Keel ≥ 3× the SDK on Postgres and ≥ 0.5× the
// SDK in memory, in the same run).
//
// Environment:
//   BENCH_SECONDS          measured seconds per target and concurrency (10)
//   BENCH_WARMUP_SECONDS   warm-up seconds before each measurement (2)
//   BENCH_CONCURRENCY      concurrent clients, or a list: "1,32,256" (32)
//   BENCH_ROUNDS           repeat the whole sequence of targets this many times and report the
//                          median (1); on a machine with other work going on, 3 gives steadier ratios
//   BENCH_TARGETS          which targets: sdk-memory,sdk-postgres,keel (all three)
//   BENCH_KEEL_QUEUE       redis | postgres (redis; Redis at BENCH_REDIS_URL, redis://127.0.0.1:6379)
//   BENCH_KEEL_LOG_LEVEL   KEEL_LOG_LEVEL of the Keel child (warn)
//   BENCH_SDK_PG_POOL      pg.Pool size of the SDK's Postgres store (10, pg's default)
//   BENCH_JSON             also write the results as JSON to this file
//   KEEL_BENCH_ADMIN_URL   Postgres admin URL (bench/support.ts)

type TargetId = 'sdk-memory' | 'sdk-postgres' | 'keel';

type Measurement = {
  round: number;
  concurrency: number;
  seconds: number;
  successes: number;
  tasksPerSecond: number;
  p50: number;
  p99: number;
  errors: number;
  errorKinds: Record<string, number>;
};

type DatabaseWork = { requests: number; commits: number; rollbacks: number; rowsWritten: number; statements?: number };

type TargetResult = {
  id: TargetId;
  label: string;
  unavailable?: string;
  measurements: Measurement[];
  databaseWork?: DatabaseWork;
};

const repoRoot = fileURLToPath(new URL('..', import.meta.url));
const seconds = positiveNumber('BENCH_SECONDS', 10);
const warmupSeconds = nonNegativeNumber('BENCH_WARMUP_SECONDS', 2);
const rounds = positiveNumber('BENCH_ROUNDS', 1);
if (!Number.isInteger(rounds)) fail('BENCH_ROUNDS: expected a positive integer');
let currentRound = 1;
const concurrencies = (process.env.BENCH_CONCURRENCY ?? '32').split(',').map((item) => {
  const value = Number(item.trim());
  if (!Number.isInteger(value) || value < 1) fail(`BENCH_CONCURRENCY: "${item}" is not a positive integer`);
  return value;
});
const targetIds = (process.env.BENCH_TARGETS ?? 'sdk-memory,sdk-postgres,keel').split(',').map((item) => {
  const id = item.trim();
  if (id !== 'sdk-memory' && id !== 'sdk-postgres' && id !== 'keel') fail(`BENCH_TARGETS: unknown target "${id}" (sdk-memory, sdk-postgres, keel)`);
  return id;
});
const keelQueue = process.env.BENCH_KEEL_QUEUE ?? 'redis';
if (keelQueue !== 'redis' && keelQueue !== 'postgres') fail(`BENCH_KEEL_QUEUE: expected redis or postgres, got "${keelQueue}"`);
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';
const sdkPoolSize = positiveNumber('BENCH_SDK_PG_POOL', 10);

function fail(message: string): never {
  console.error(`bench:a2a: ${message}`);
  process.exit(2);
}

function positiveNumber(name: string, fallback: number): number {
  const value = Number(process.env[name] ?? fallback);
  if (!Number.isFinite(value) || value <= 0) fail(`${name}: expected a positive number`);
  return value;
}

function nonNegativeNumber(name: string, fallback: number): number {
  const value = Number(process.env[name] ?? fallback);
  if (!Number.isFinite(value) || value < 0) fail(`${name}: expected a number ≥ 0`);
  return value;
}

// ---------------------------------------------------------------------------------------------
// Interruption and child processes. Every child runs in a process group of its own (so a Ctrl-C in
// the terminal reaches only this harness, which then stops the children in order and lets each
// withBenchDatabase drop its database). A second Ctrl-C kills the children at once and exits.

const interrupted = new AbortController();
// Every in-flight request listens on it.
setMaxListeners(0, interrupted.signal);
const liveChildren = new Set<ManagedChild>();
const liveDatabases = new Set<string>();
let firstSignalAt = 0;

function onSignal(signal: NodeJS.Signals): void {
  const now = Date.now();
  if (firstSignalAt === 0) {
    firstSignalAt = now;
    console.error(`\nbench:a2a: ${signal}, stopping the servers and dropping the bench databases (again to force)`);
    interrupted.abort(new Error(`interrupted by ${signal}`));
    return;
  }
  // One Ctrl-C can arrive twice: from the terminal and relayed by tsx (which re-sends when it has not
  // heard back from this process within 30 ms). Only a later one means "force".
  if (now - firstSignalAt < 500) return;
  for (const child of liveChildren) child.kill('SIGKILL');
  if (liveDatabases.size > 0) console.error(`bench:a2a: left behind, drop by hand: ${[...liveDatabases].join(', ')}`);
  process.exit(130);
}
process.on('SIGINT', onSignal);
process.on('SIGTERM', onSignal);
process.on('exit', () => {
  for (const child of liveChildren) child.kill('SIGKILL');
});

function throwIfInterrupted(): void {
  if (interrupted.signal.aborted) throw interrupted.signal.reason as Error;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve, reject) => {
    if (interrupted.signal.aborted) return reject(interrupted.signal.reason as Error);
    const onAbort = () => {
      clearTimeout(timer);
      reject(interrupted.signal.reason as Error);
    };
    const timer = setTimeout(() => {
      interrupted.signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    interrupted.signal.addEventListener('abort', onAbort, { once: true });
  });
}

class ManagedChild {
  readonly process: ChildProcess;
  private readonly output: string[] = [];
  readonly exited: Promise<number | null>;
  private hasExited = false;

  constructor(
    readonly name: string,
    command: string,
    args: string[],
    options: { env?: NodeJS.ProcessEnv; ipc?: boolean },
  ) {
    this.process = spawn(command, args, {
      cwd: repoRoot,
      env: options.env ?? process.env,
      detached: true,
      stdio: options.ipc ? ['ignore', 'pipe', 'pipe', 'ipc'] : ['ignore', 'pipe', 'pipe'],
    });
    liveChildren.add(this);
    const keep = (chunk: Buffer) => {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.trim() === '') continue;
        this.output.push(line);
        if (this.output.length > 60) this.output.shift();
      }
    };
    this.process.stdout?.on('data', keep);
    this.process.stderr?.on('data', keep);
    this.exited = new Promise((resolve) => {
      this.process.on('exit', (code, signal) => {
        this.hasExited = true;
        liveChildren.delete(this);
        resolve(code ?? (signal ? 128 : null));
      });
      this.process.on('error', (error) => {
        this.output.push(`spawn failed: ${error.message}`);
        this.hasExited = true;
        liveChildren.delete(this);
        resolve(null);
      });
    });
  }

  get running(): boolean {
    return !this.hasExited;
  }

  tail(lines = 15): string {
    return this.output.slice(-lines).join('\n');
  }

  kill(signal: NodeJS.Signals): void {
    if (!this.running || this.process.pid === undefined) return;
    try {
      process.kill(-this.process.pid, signal);
    } catch {
      // Already gone.
    }
  }

  /** SIGTERM to the child's process group, SIGKILL if it has not exited after `graceMs`. */
  async stop(graceMs = 10_000): Promise<void> {
    if (!this.running) return;
    this.kill('SIGTERM');
    const timer = setTimeout(() => this.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(timer);
  }
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** Polls `url` until it answers 200; fails when the child exits first or after `timeoutMs`. */
async function waitUntilReady(child: ManagedChild, url: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer';
  while (Date.now() < deadline) {
    throwIfInterrupted();
    if (!child.running) throw new Error(`${child.name} exited before it was ready:\n${child.tail()}`);
    try {
      const response = await fetch(url, { signal: AbortSignal.timeout(2000) });
      await response.arrayBuffer();
      if (response.status === 200) return;
      last = `HTTP ${response.status}`;
    } catch (error) {
      last = (error as Error).message;
    }
    await sleep(100);
  }
  throw new Error(`${child.name} not ready after ${timeoutMs / 1000} s (${url}: ${last}):\n${child.tail()}`);
}

// ---------------------------------------------------------------------------------------------
// The load.

const A2A_HEADERS = { 'content-type': 'application/json', 'a2a-version': '1.0' };
let requestSequence = 0;

function sendMessageBody(id: number, text: string): string {
  return JSON.stringify({
    jsonrpc: '2.0',
    id,
    method: 'SendMessage',
    params: { message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text }] } },
  });
}

type JsonRpcAnswer = {
  result?: { task?: { status?: { state?: string }; artifacts?: { parts?: { text?: string }[] }[] } };
  error?: { code?: number; message?: string };
};

/** null for a completed task carrying the expected artifact text, else what went wrong. */
function judge(statusCode: number, raw: string, text: string): string | null {
  let answer: JsonRpcAnswer;
  try {
    answer = JSON.parse(raw) as JsonRpcAnswer;
  } catch {
    return `HTTP ${statusCode}, not JSON: ${raw.slice(0, 80)}`;
  }
  if (answer.error) return `HTTP ${statusCode}, JSON-RPC ${answer.error.code}: ${String(answer.error.message).slice(0, 100)}`;
  if (statusCode !== 200) return `HTTP ${statusCode}`;
  const task = answer.result?.task;
  if (!task) return 'result is not a task';
  const state = task.status?.state;
  if (state !== 'TASK_STATE_COMPLETED') return `task state ${state}`;
  const expected = `echo: ${text}`;
  const found = (task.artifacts ?? []).some((artifact) => (artifact.parts ?? []).some((part) => part.text === expected));
  return found ? null : 'completed without the expected artifact text';
}

/** One blocking SendMessage; the answer's judgement (null = success) and its latency in ms. */
async function sendOne(pool: Pool, path: string): Promise<{ error: string | null; ms: number }> {
  const id = ++requestSequence;
  const text = `hi ${id}`;
  const body = sendMessageBody(id, text);
  const started = performance.now();
  try {
    const response = await pool.request({ path, method: 'POST', headers: A2A_HEADERS, body, signal: interrupted.signal });
    const raw = await response.body.text();
    return { error: judge(response.statusCode, raw, text), ms: performance.now() - started };
  } catch (error) {
    const code = (error as { code?: string }).code;
    return { error: `request failed: ${code ?? (error as Error).message}`, ms: performance.now() - started };
  }
}

async function measure(origin: string, path: string, concurrency: number, round: number): Promise<{ measurement: Measurement; requests: number }> {
  const pool = new Pool(origin, {
    connections: concurrency,
    pipelining: 1,
    keepAliveTimeout: 30_000,
    headersTimeout: 120_000,
    bodyTimeout: 120_000,
  });
  const begin = performance.now();
  const windowStart = begin + warmupSeconds * 1000;
  const windowEnd = windowStart + seconds * 1000;
  const latencies: number[] = [];
  const errorKinds: Record<string, number> = {};
  let errors = 0;
  let requests = 0;
  const client = async () => {
    while (!interrupted.signal.aborted && performance.now() < windowEnd) {
      const { error, ms } = await sendOne(pool, path);
      requests += 1;
      const finished = performance.now();
      // A request counts in the window it completes in; the warm-up and the drain after the
      // window are load, not measurement.
      if (finished < windowStart || finished > windowEnd) continue;
      if (error === null) {
        latencies.push(ms);
      } else {
        errors += 1;
        errorKinds[error] = (errorKinds[error] ?? 0) + 1;
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: concurrency }, client));
  } finally {
    await pool.close().catch(() => undefined);
  }
  throwIfInterrupted();
  latencies.sort((a, b) => a - b);
  return {
    requests,
    measurement: {
      round,
      concurrency,
      seconds,
      successes: latencies.length,
      tasksPerSecond: latencies.length / seconds,
      p50: percentile(latencies, 50),
      p99: percentile(latencies, 99),
      errors,
      errorKinds,
    },
  };
}

async function runLoad(result: TargetResult, origin: string, path: string): Promise<number> {
  let requests = 0;
  for (const concurrency of concurrencies) {
    await checkpoint();
    const roundNote = rounds > 1 ? `round ${currentRound}/${rounds}, ` : '';
    process.stderr.write(`  ${result.label}: ${roundNote}concurrency ${concurrency}, ${warmupSeconds} s warm-up + ${seconds} s ...`);
    const { measurement, requests: sent } = await measure(origin, path, concurrency, currentRound);
    requests += sent;
    result.measurements.push(measurement);
    process.stderr.write(` ${fmt(measurement.tasksPerSecond)} tasks/s, ${measurement.errors} errors\n`);
  }
  return requests;
}

// ---------------------------------------------------------------------------------------------
// Postgres side: a checkpoint before each measurement (so no target inherits another's dirty
// pages), and the bench database's own counters for the work each task cost.

async function withAdmin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function checkpoint(): Promise<void> {
  await withAdmin((client) => client.query('CHECKPOINT')).catch(() => undefined);
}

type DatabaseCounters = { commits: number; rollbacks: number; rowsWritten: number; backends: number };

function databaseName(url: string): string {
  return new URL(url).pathname.slice(1);
}

async function databaseCounters(name: string): Promise<DatabaseCounters> {
  return withAdmin(async (client) => {
    const { rows } = await client.query<{ commits: string; rollbacks: string; written: string; backends: number }>(
      `SELECT xact_commit AS commits, xact_rollback AS rollbacks, tup_inserted + tup_updated + tup_deleted AS written, numbackends AS backends
         FROM pg_stat_database WHERE datname = $1`,
      [name],
    );
    const row = rows[0];
    return { commits: Number(row?.commits ?? 0), rollbacks: Number(row?.rollbacks ?? 0), rowsWritten: Number(row?.written ?? 0), backends: row?.backends ?? 0 };
  });
}

/** Counters once the server's connections are gone (a backend flushes its statistics when it exits). */
async function settledCounters(name: string): Promise<DatabaseCounters> {
  const deadline = Date.now() + 10_000;
  let counters = await databaseCounters(name);
  while (counters.backends > 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 200));
    counters = await databaseCounters(name);
  }
  await new Promise((resolve) => setTimeout(resolve, 500));
  return databaseCounters(name);
}

/** Adds one server's run to the target's totals (summed over rounds). */
function addDatabaseWork(result: TargetResult, before: DatabaseCounters, after: DatabaseCounters, requests: number, statements?: number): void {
  const total = result.databaseWork ?? { requests: 0, commits: 0, rollbacks: 0, rowsWritten: 0 };
  total.requests += requests;
  total.commits += after.commits - before.commits;
  total.rollbacks += after.rollbacks - before.rollbacks;
  total.rowsWritten += after.rowsWritten - before.rowsWritten;
  if (statements !== undefined) total.statements = (total.statements ?? 0) + statements;
  result.databaseWork = total;
}

async function withTrackedDatabase<T>(fn: (url: string) => Promise<T>): Promise<T> {
  return withBenchDatabase(async (url) => {
    const name = databaseName(url);
    liveDatabases.add(name);
    try {
      return await fn(url);
    } finally {
      liveDatabases.delete(name);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The targets.

const sdkServerScript = fileURLToPath(new URL('./sdk-echo-server.ts', import.meta.url));
const a2aDbScript = fileURLToPath(new URL('../node_modules/@a2a-js/sdk/dist/cli/a2a_db.js', import.meta.url));

async function startSdkServer(kind: 'memory' | 'postgres', databaseUrl?: string): Promise<{ child: ManagedChild; origin: string }> {
  const port = await freePort();
  const args = ['--import', 'tsx', sdkServerScript, kind, String(port), ...(databaseUrl ? [databaseUrl] : [])];
  const child = new ManagedChild(`SDK server (${kind})`, process.execPath, args, {
    env: { ...process.env, BENCH_SDK_PG_POOL: String(sdkPoolSize) },
    ipc: true,
  });
  const origin = `http://127.0.0.1:${port}`;
  try {
    await waitUntilReady(child, `${origin}/.well-known/agent-card.json`, 30_000);
  } catch (error) {
    await child.stop();
    throw error;
  }
  return { child, origin };
}

async function sdkStatements(origin: string): Promise<number> {
  const response = await fetch(`${origin}/bench/stats`);
  return ((await response.json()) as { statements: number }).statements;
}

async function benchSdkMemory(result: TargetResult): Promise<void> {
  const { child, origin } = await startSdkServer('memory');
  try {
    await runLoad(result, origin, '/');
  } finally {
    await child.stop();
  }
}

async function benchSdkPostgres(result: TargetResult): Promise<void> {
  await withTrackedDatabase(async (databaseUrl) => {
    // The store's table comes from the SDK's own migration tool, as its docs ask.
    await promisify(execFile)(process.execPath, [a2aDbScript, 'upgrade', '--url', databaseUrl, '--store', 'tasks'], { cwd: repoRoot });
    const { child, origin } = await startSdkServer('postgres', databaseUrl);
    let requests = 0;
    let statements = 0;
    let before: DatabaseCounters | undefined;
    try {
      await sleep(1200);
      before = await databaseCounters(databaseName(databaseUrl));
      const statementsBefore = await sdkStatements(origin);
      requests = await runLoad(result, origin, '/');
      statements = (await sdkStatements(origin)) - statementsBefore;
    } finally {
      await child.stop();
    }
    if (before) addDatabaseWork(result, before, await settledCounters(databaseName(databaseUrl)), requests, statements);
  });
}

async function benchKeel(result: TargetResult): Promise<void> {
  await withTrackedDatabase(async (databaseUrl) => {
    const dataDir = mkdtempSync(join(tmpdir(), 'keel-bench-a2a-'));
    const configFile = join(dataDir, 'bench.config.yaml');
    // An empty config file, so a keel.config.yaml in the working directory cannot change the run.
    writeFileSync(configFile, '# bench:a2a: everything comes from the environment\n');
    const port = await freePort();
    const queuePrefix = `bencha2a${randomBytes(4).toString('hex')}`;
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      KEEL_CONFIG: configFile,
      KEEL_DATABASE_URL: databaseUrl,
      KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()),
      KEEL_SERVER_HOST: '127.0.0.1',
      KEEL_SERVER_PORT: String(port),
      KEEL_DATA_DIR: dataDir,
      KEEL_AUTH_MODE: 'none',
      KEEL_QUEUE_PREFIX: queuePrefix,
      KEEL_LOG_LEVEL: process.env.BENCH_KEEL_LOG_LEVEL ?? 'warn',
    };
    delete env.KEEL_QUEUE_REDIS_URL;
    if (keelQueue === 'redis') env.KEEL_QUEUE_REDIS_URL = redisUrl;
    const origin = `http://127.0.0.1:${port}`;
    const child = new ManagedChild('Keel', process.execPath, [join(repoRoot, 'bin/keel.js'), 'start'], { env });
    let requests = 0;
    let before: DatabaseCounters | undefined;
    try {
      await waitUntilReady(child, `${origin}/readyz`, 90_000);
      const probe = await fetch(`${origin}/a2a/echo`, { method: 'POST', headers: A2A_HEADERS, body: sendMessageBody(0, 'probe') });
      const probeBody = await probe.text();
      if (probe.status === 404) {
        result.unavailable = `POST /a2a/echo answered 404 (Keel's A2A server is not built yet)`;
        return;
      }
      const probeError = judge(probe.status, probeBody, 'probe');
      if (probeError) console.error(`  Keel: the probe request failed (${probeError}); measuring anyway`);
      await sleep(1200);
      before = await databaseCounters(databaseName(databaseUrl));
      requests = await runLoad(result, origin, '/a2a/echo');
    } finally {
      await child.stop(15_000);
      if (keelQueue === 'redis') await dropRedisKeys(queuePrefix);
      rmSync(dataDir, { recursive: true, force: true });
    }
    if (before) addDatabaseWork(result, before, await settledCounters(databaseName(databaseUrl)), requests);
  });
}

/** Best effort: the bench's queue keys out of the shared Redis. */
async function dropRedisKeys(prefix: string): Promise<void> {
  try {
    const { Redis } = await import('ioredis');
    const redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
    await redis.connect();
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

const TARGETS: Record<TargetId, { label: string; run: (result: TargetResult) => Promise<void> }> = {
  'sdk-memory': { label: 'SDK in-memory', run: benchSdkMemory },
  'sdk-postgres': { label: 'SDK Postgres', run: benchSdkPostgres },
  keel: { label: `Keel (${keelQueue} queue)`, run: benchKeel },
};

// ---------------------------------------------------------------------------------------------
// Report.

function machineLine(postgresVersion: string): string {
  const cores = cpus();
  const model = cores[0]?.model.trim() ?? 'unknown CPU';
  return `machine: ${cores.length} cores (${model}), ${fmt(totalmem() / 2 ** 30)} GiB, ${platform()} ${arch()}, node ${process.version}, Postgres ${postgresVersion}; ${new Date().toISOString()}`;
}

type Summary = { tasksPerSecond: number; min: number; max: number; p50: number; p99: number; errors: number; rounds: number };

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/** The target's figures at one concurrency: medians over the rounds it was measured in. */
function summarize(result: TargetResult | undefined, concurrency: number): Summary | undefined {
  const runs = result?.measurements.filter((m) => m.concurrency === concurrency) ?? [];
  if (runs.length === 0) return undefined;
  const rates = runs.map((m) => m.tasksPerSecond);
  return {
    tasksPerSecond: median(rates),
    min: Math.min(...rates),
    max: Math.max(...rates),
    p50: median(runs.map((m) => m.p50)),
    p99: median(runs.map((m) => m.p99)),
    errors: runs.reduce((sum, m) => sum + m.errors, 0),
    rounds: runs.length,
  };
}

function report(results: TargetResult[], postgresVersion: string): void {
  const lines: string[] = [];
  lines.push('');
  lines.push('bench:a2a — blocking SendMessage over JSON-RPC, echo agent, a new task per request');
  lines.push(machineLine(postgresVersion));
  lines.push(
    `load: ${warmupSeconds} s warm-up + ${seconds} s measured per target and concurrency${rounds > 1 ? `, ${rounds} rounds (figures are medians; range = tasks/s min–max)` : ''}; ` +
      `one server at a time, each in its own process; load generator, servers, Postgres${keelQueue === 'redis' ? ' and Redis' : ''} share the machine; ` +
      `Keel queue backend: ${keelQueue}; SDK pg pool: ${sdkPoolSize}`,
  );
  lines.push('success = a COMPLETED task carrying the expected artifact text; latency percentiles over successes; errors summed over rounds');

  for (const concurrency of concurrencies) {
    lines.push('');
    lines.push(`concurrency ${concurrency}`);
    const range = rounds > 1 ? ` ${'range'.padStart(15)}` : '';
    lines.push(`  ${'target'.padEnd(22)} ${'tasks/s'.padStart(9)} ${'p50 ms'.padStart(8)} ${'p99 ms'.padStart(8)} ${'errors'.padStart(7)}${range}`);
    for (const result of results) {
      const m = summarize(result, concurrency);
      if (!m) {
        lines.push(`  ${result.label.padEnd(22)} not available${result.unavailable ? `: ${firstLine(result.unavailable)}` : ''}`);
        continue;
      }
      const spread = rounds > 1 ? ` ${`${fmt(m.min)}–${fmt(m.max)}`.padStart(15)}` : '';
      lines.push(`  ${result.label.padEnd(22)} ${fmt(m.tasksPerSecond).padStart(9)} ${ms(m.p50).padStart(8)} ${ms(m.p99).padStart(8)} ${String(m.errors).padStart(7)}${spread}`);
    }
    const keelResult = results.find((result) => result.id === 'keel');
    if (!keelResult) continue;
    const keel = summarize(keelResult, concurrency);
    const ratios: [TargetId, string, number][] = [
      ['sdk-postgres', 'SDK Postgres', 3],
      ['sdk-memory', 'SDK in-memory', 0.5],
    ];
    for (const [id, label, target] of ratios) {
      const sdk = summarize(results.find((result) => result.id === id), concurrency);
      if (!sdk) continue;
      if (!keel) {
        lines.push(`  Keel ÷ ${label}: no Keel figure (target ≥ ${target}×)`);
        continue;
      }
      const ratio = sdk.tasksPerSecond > 0 ? keel.tasksPerSecond / sdk.tasksPerSecond : Number.NaN;
      lines.push(`  Keel ÷ ${label}: ${fmt(ratio, 2)}× (target ≥ ${target}×: ${ratio >= target ? 'met' : 'not met'})`);
    }
  }

  const withErrors = results.flatMap((result) => result.measurements.filter((m) => m.errors > 0).map((m) => ({ result, m })));
  if (withErrors.length > 0) {
    lines.push('');
    lines.push('errors');
    for (const { result, m } of withErrors) {
      const kinds = Object.entries(m.errorKinds).sort((a, b) => b[1] - a[1]);
      lines.push(`  ${result.label}, concurrency ${m.concurrency}${rounds > 1 ? `, round ${m.round}` : ''}:`);
      for (const [kind, count] of kinds.slice(0, 8)) lines.push(`    ${String(count).padStart(7)} × ${kind}`);
      if (kinds.length > 8) lines.push(`    ... and ${kinds.length - 8} other kinds`);
    }
  }

  // The table shows the first line; a longer reason (a child's last output) comes here in full.
  const unavailable = results.filter((result) => result.unavailable?.includes('\n'));
  if (unavailable.length > 0) {
    lines.push('');
    for (const result of unavailable) lines.push(`${result.label} not available: ${result.unavailable}`);
  }

  const work = results.filter((result) => result.databaseWork && result.databaseWork.requests > 0);
  if (work.length > 0) {
    lines.push('');
    lines.push('database work per request (bench database counters over the whole load, warm-up included; approximate)');
    for (const result of work) {
      const w = result.databaseWork!;
      const per = (value: number) => fmt(value / w.requests, 2);
      const statements = w.statements === undefined ? '' : `${per(w.statements)} statements, `;
      lines.push(`  ${result.label.padEnd(22)} ${statements}${per(w.commits)} commits, ${per(w.rollbacks)} rollbacks, ${per(w.rowsWritten)} rows written (${w.requests} requests)`);
    }
    lines.push('  (a commit here is any committed transaction, reads included: pg_stat_database.xact_commit)');
  }
  console.log(lines.join('\n'));
}

function ms(value: number): string {
  return Number.isNaN(value) ? '-' : fmt(value);
}

function firstLine(text: string): string {
  return text.split('\n')[0]!;
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  const postgresVersion = await withAdmin(async (client) => (await client.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version);
  console.error(
    `bench:a2a: targets ${targetIds.join(', ')}; concurrency ${concurrencies.join(', ')}; ${warmupSeconds} s warm-up + ${seconds} s each` +
      `${rounds > 1 ? `; ${rounds} rounds` : ''}; Keel queue backend: ${keelQueue}`,
  );
  const results: TargetResult[] = targetIds.map((id) => ({ id, label: TARGETS[id].label, measurements: [] }));
  for (currentRound = 1; currentRound <= rounds && !interrupted.signal.aborted; currentRound += 1) {
    for (const result of results) {
      // A target that could not be measured once is not retried in later rounds.
      if (result.unavailable) continue;
      try {
        await TARGETS[result.id].run(result);
      } catch (error) {
        if (interrupted.signal.aborted) break;
        result.unavailable = (error as Error).message;
        console.error(`  ${result.label}: ${result.unavailable}`);
      }
    }
  }
  if (interrupted.signal.aborted) {
    console.error('bench:a2a: interrupted; the servers are stopped and the bench databases dropped');
    return 130;
  }
  report(results, postgresVersion);
  if (process.env.BENCH_JSON) {
    const document = {
      date: new Date().toISOString(),
      machine: { cores: cpus().length, cpu: cpus()[0]?.model.trim(), node: process.version, postgres: postgresVersion },
      load: { warmupSeconds, seconds, rounds, concurrencies, keelQueue, sdkPoolSize },
      results,
    };
    writeFileSync(process.env.BENCH_JSON, `${JSON.stringify(document, null, 2)}\n`);
  }
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: Error) => {
    console.error(`bench:a2a failed: ${error.stack ?? error.message}`);
    process.exit(interrupted.signal.aborted ? 130 : 1);
  },
);
