import { spawnSync } from 'node:child_process';
import { setMaxListeners } from 'node:events';
import { cpus } from 'node:os';
import pg from 'pg';
import { Pool } from 'undici';
import { fmt } from './support.js';
import {
  A2A_HEADERS,
  collectGarbage,
  countError,
  descendantsOf,
  dropRedisKeys,
  inspectorUrl,
  interrupted,
  judgeSend,
  machineLine,
  mib,
  newInstallation,
  openKeelBench,
  postgresVersion,
  procDescriptors,
  procMemory,
  procOpenFileLimit,
  processCommand,
  rpcBody,
  runBench,
  scrapeMetrics,
  sendMessageParams,
  servingProcess,
  sleep,
  startKeelProcess,
  stopKeelProcess,
  throwIfInterrupted,
  withTrackedDatabase,
  writeBenchJson,
  type KeelChild,
} from './keel-harness.js';

// bench:memory — resident memory of one Keel process (`node bin/keel.js start`, role all): after it
// is ready, after BENCH_MEMORY_TASKS echo tasks were sent and completed over HTTP (blocking
// SendMessage), and with BENCH_MEMORY_STREAMS SSE streams open at once, then after they are closed.
// Prints a table and a JSON line; asserts nothing.
//
// Which process: bin/keel.js imports the compiled CLI in-process (decision 0034), so the node
// process spawned here serves HTTP itself; the bench checks it by finding the process (that pid or
// a descendant) holding the listening socket of Keel's port, and reads VmRSS / VmHWM from
// /proc/<pid>/status. Postgres and Redis are the machine's (external) and not counted.
//
// The streams: tasks that stay open, on a `hold` agent (scripted provider, one step with a long
// delay; the config file is the bench's own). By default BENCH_MEMORY_STREAMS hold tasks are created
// first (returnImmediately), memory is read, then one SubscribeToTask stream per task is opened
// (JSON-RPC, SSE), so the increment is the streams' alone; a stream counts as open once its first
// event (the Task snapshot) arrived. They are closed by cancelling every task (CancelTask): each
// stream must receive TASK_STATE_CANCELED and be ended by the server. Keel's descriptor count
// (sockets) shows the connections really held and really released.
//
// Limits that could refuse the streams: there is no stream or connection cap in src/a2a or in the
// Fastify server (no maxConnections, connectionTimeout 0; keepAliveTimeout applies to idle
// keep-alive connections only; Node's headersTimeout only until the request headers are in); an
// idle stream takes no database connection (it waits for the journal NOTIFY, rereads the journal
// every 15 s and writes a keep-alive comment every 15 s). Open files: printed below for the shell,
// this process and Keel (Node raises its soft RLIMIT_NOFILE to the hard limit at start-up).
//
// Environment:
//   BENCH_MEMORY_TASKS            echo tasks sent and completed (100000)
//   BENCH_MEMORY_STREAMS          streams open at once (1000)
//   BENCH_MEMORY_PROGRESS_EVERY   progress line every so many tasks (10000)
//   BENCH_CONCURRENCY             concurrent clients for the tasks (32)
//   BENCH_MEMORY_STREAM_METHOD    subscribe (SubscribeToTask on existing hold tasks) | send
//                                 (SendStreamingMessage, each stream creates its hold task) (subscribe)
//   BENCH_MEMORY_OPEN_CONCURRENCY streams being opened at the same moment (64)
//   BENCH_MEMORY_SETTLE_SECONDS   idle wait before each memory reading (3)
//   BENCH_MEMORY_HOLD_SECONDS     the hold agent's delay, at most 600 (600): a held run that
//                                 finishes before the streams are closed shows as a stream end failure
//   BENCH_MEMORY_GC               1: Keel runs with Node's inspector on a free loopback port
//                                 (NODE_OPTIONS=--inspect=127.0.0.1:0) and each stage's reading is
//                                 taken after a full GC forced through it (HeapProfiler.collectGarbage),
//                                 so heap figures are live data, not garbage; 0: no inspector, no
//                                 forced GC (1)
// and the knobs every Keel bench reads (bench/keel-harness.ts): BENCH_KEEL_QUEUE (redis | postgres),
// BENCH_REDIS_URL, BENCH_KEEL_LOG_LEVEL, BENCH_JSON, KEEL_BENCH_ADMIN_URL.

const BENCH = 'bench:memory';
const { knobs, queue } = openKeelBench(BENCH);
const taskCount = knobs.positiveInt('BENCH_MEMORY_TASKS', 100_000);
const streamCount = knobs.positiveInt('BENCH_MEMORY_STREAMS', 1000);
const progressEvery = knobs.positiveInt('BENCH_MEMORY_PROGRESS_EVERY', 10_000);
const concurrency = knobs.positiveInt('BENCH_CONCURRENCY', 32);
const streamMethod = knobs.choice('BENCH_MEMORY_STREAM_METHOD', 'subscribe', ['subscribe', 'send'] as const);
const openConcurrency = knobs.positiveInt('BENCH_MEMORY_OPEN_CONCURRENCY', 64);
const settleSeconds = knobs.nonNegative('BENCH_MEMORY_SETTLE_SECONDS', 3);
const holdSeconds = knobs.positive('BENCH_MEMORY_HOLD_SECONDS', 600);
if (holdSeconds > 600) knobs.fail('BENCH_MEMORY_HOLD_SECONDS: at most 600 (the scripted provider allows delayMs ≤ 600000)');
const forceGc = knobs.choice('BENCH_MEMORY_GC', '1', ['0', '1'] as const) === '1';

const CONFIG_YAML = `# bench:memory: the default echo agent and a hold agent whose tasks stay open
providers:
  echo: { type: echo }
  hold: { type: scripted, steps: [{ delayMs: ${Math.round(holdSeconds * 1000)}, reply: held }] }
agents:
  - { id: echo, name: Echo, provider: echo, privacy: { answerLevel: full } }
  - { id: hold, name: Hold, provider: hold, privacy: { answerLevel: full } }
# The bench's one client holds every stream and hold task, past the default per-client limits
# (200 streams; docs/reliability.md, "Per-client limits").
limits:
  default: { openStreams: ${streamCount + 100}, concurrentRuns: ${streamCount + 5000} }
`;

// ---------------------------------------------------------------------------------------------
// Readings.

type Reading = {
  stage: string;
  rssKiB: number;
  hwmKiB: number;
  heapUsedBytes: number | null;
  fds: number;
  sockets: number;
  /** Processes Keel spawned (esbuild's service while it builds; tsx's only for a TypeScript tool module), not in rssKiB. */
  children: { pid: number; command: string; rssKiB: number }[];
  at: string;
};

let servingPid = -1;
let keelOrigin = '';
let inspector: string | null = null;

async function reading(stage: string, settle = true): Promise<Reading> {
  if (settle && settleSeconds > 0) await sleep(settleSeconds * 1000);
  if (inspector) {
    await collectGarbage(inspector);
    await sleep(500);
  }
  const memory = procMemory(servingPid);
  const descriptors = procDescriptors(servingPid);
  const children = descendantsOf(servingPid).flatMap((pid) => {
    try {
      return [{ pid, command: processCommand(pid), rssKiB: procMemory(pid).rssKiB }];
    } catch {
      return [];
    }
  });
  // After the /proc reading: a scrape allocates too.
  const metrics = await scrapeMetrics(keelOrigin);
  const heapUsed = metrics?.get('keel_process_nodejs_heap_size_used_bytes') ?? null;
  const result = { stage, rssKiB: memory.rssKiB, hwmKiB: memory.hwmKiB, heapUsedBytes: heapUsed, fds: descriptors.total, sockets: descriptors.sockets, children, at: new Date().toISOString() };
  process.stderr.write(`  ${stage}: RSS ${fmt(mib(result.rssKiB))} MiB, ${result.sockets} sockets\n`);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Phase 1: tasks.

type Progress = { done: number; seconds: number; rssKiB: number; intervalRate: number; overallRate: number; errors: number };

let requestSequence = 0;

async function sendTasks(): Promise<{ completed: number; errors: number; errorKinds: Record<string, number>; seconds: number; progress: Progress[] }> {
  const pool = new Pool(keelOrigin, { connections: concurrency, pipelining: 1, keepAliveTimeout: 30_000, headersTimeout: 120_000, bodyTimeout: 120_000 });
  const started = performance.now();
  let issued = 0;
  let completed = 0;
  let errors = 0;
  const errorKinds: Record<string, number> = {};
  const progress: Progress[] = [];
  let last = { done: 0, at: started };
  const report = () => {
    const now = performance.now();
    const done = completed + errors;
    const entry: Progress = {
      done,
      seconds: (now - started) / 1000,
      rssKiB: procMemory(servingPid).rssKiB,
      intervalRate: ((done - last.done) * 1000) / (now - last.at),
      overallRate: (done * 1000) / (now - started),
      errors,
    };
    progress.push(entry);
    last = { done, at: now };
    process.stderr.write(
      `  ${String(done).padStart(8)} tasks  ${fmt(entry.seconds).padStart(7)} s  RSS ${fmt(mib(entry.rssKiB)).padStart(7)} MiB  ` +
        `${fmt(entry.intervalRate).padStart(7)} tasks/s (overall ${fmt(entry.overallRate)})  errors ${errors}\n`,
    );
  };
  const client = async () => {
    while (!interrupted.signal.aborted && issued < taskCount) {
      issued += 1;
      const id = ++requestSequence;
      const text = `mem ${id}`;
      try {
        const response = await pool.request({
          path: '/a2a/echo',
          method: 'POST',
          headers: A2A_HEADERS,
          body: rpcBody(id, 'SendMessage', sendMessageParams(text)),
          signal: interrupted.signal,
        });
        const judged = judgeSend(response.statusCode, await response.body.text(), text, ['TASK_STATE_COMPLETED']);
        if ('error' in judged) {
          errors += 1;
          countError(errorKinds, judged.error);
        } else completed += 1;
      } catch (error) {
        if (interrupted.signal.aborted) break;
        errors += 1;
        countError(errorKinds, `request failed: ${(error as { code?: string }).code ?? (error as Error).message}`);
      }
      if ((completed + errors) % progressEvery === 0) report();
    }
  };
  try {
    await Promise.all(Array.from({ length: concurrency }, client));
  } finally {
    await pool.close().catch(() => undefined);
  }
  throwIfInterrupted();
  if (progress.at(-1)?.done !== completed + errors) report();
  return { completed, errors, errorKinds, seconds: (performance.now() - started) / 1000, progress };
}

// ---------------------------------------------------------------------------------------------
// Phase 2: streams.

type StreamState = {
  taskId: string | null;
  opened: boolean;
  ended: boolean;
  endError: string | null;
  events: number;
  lastState: string | null;
  openError: string | null;
};

type StreamFrame = { result?: { task?: { id?: string; status?: { state?: string } }; statusUpdate?: { status?: { state?: string } } }; error?: { code?: number; message?: string } };

/** Opens one stream; resolves once its first event arrived (or it failed); reading goes on in the background until the server ends it. */
function openStream(pool: Pool, index: number, taskId: string | null, signal: AbortSignal): { state: StreamState; firstEvent: Promise<void>; ended: Promise<void> } {
  const state: StreamState = { taskId, opened: false, ended: false, endError: null, events: 0, lastState: null, openError: null };
  let markOpened: () => void = () => undefined;
  const firstEvent = new Promise<void>((resolve) => (markOpened = resolve));
  const body =
    streamMethod === 'subscribe'
      ? rpcBody(index, 'SubscribeToTask', { id: taskId })
      : rpcBody(index, 'SendStreamingMessage', sendMessageParams(`stream ${index}`));
  const ended = (async () => {
    try {
      const response = await pool.request({ path: '/a2a/hold', method: 'POST', headers: { ...A2A_HEADERS, accept: 'text/event-stream' }, body, signal });
      const type = String(response.headers['content-type'] ?? '');
      if (response.statusCode !== 200 || !type.startsWith('text/event-stream')) {
        state.openError = `HTTP ${response.statusCode} ${type}: ${(await response.body.text()).slice(0, 120)}`;
        return;
      }
      let buffer = '';
      for await (const chunk of response.body) {
        buffer += (chunk as Buffer).toString('utf8');
        let boundary: number;
        while ((boundary = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, boundary);
          buffer = buffer.slice(boundary + 2);
          const data = block
            .split('\n')
            .filter((line) => line.startsWith('data:'))
            .map((line) => line.slice(5).trimStart())
            .join('\n');
          if (data === '') continue; // a keep-alive comment
          const frame = JSON.parse(data) as StreamFrame;
          state.events += 1;
          if (frame.error) {
            state.openError ??= `JSON-RPC ${frame.error.code}: ${frame.error.message}`;
            continue;
          }
          const task = frame.result?.task;
          if (task?.id) state.taskId ??= task.id;
          state.lastState = task?.status?.state ?? frame.result?.statusUpdate?.status?.state ?? state.lastState;
          if (!state.opened) {
            state.opened = true;
            markOpened();
          }
        }
      }
      state.ended = true;
    } catch (error) {
      state.endError = signal.aborted ? 'aborted by the bench' : `${(error as { code?: string }).code ?? (error as Error).message}`;
    } finally {
      markOpened();
    }
  })();
  return { state, firstEvent, ended };
}

/** Runs `work` over `items` with at most `limit` at a time. */
async function inBatches<T>(items: readonly T[], limit: number, work: (item: T, index: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length && !interrupted.signal.aborted) {
        const index = next++;
        await work(items[index]!, index);
      }
    }),
  );
  throwIfInterrupted();
}

async function createHoldTasks(count: number): Promise<string[]> {
  const pool = new Pool(keelOrigin, { connections: concurrency, pipelining: 1 });
  const ids: string[] = [];
  const failures: Record<string, number> = {};
  try {
    await inBatches(Array.from({ length: count }), concurrency, async (_item, index) => {
      const response = await pool.request({
        path: '/a2a/hold',
        method: 'POST',
        headers: A2A_HEADERS,
        body: rpcBody(index, 'SendMessage', sendMessageParams(`hold ${index}`, { returnImmediately: true })),
      });
      const judged = judgeSend(response.statusCode, await response.body.text(), '', ['TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING']);
      if ('error' in judged) countError(failures, judged.error);
      else ids.push(judged.taskId);
    });
  } finally {
    await pool.close().catch(() => undefined);
  }
  if (ids.length !== count) throw new Error(`only ${ids.length} of ${count} hold tasks were created: ${JSON.stringify(failures)}`);
  return ids;
}

async function cancelTasks(ids: readonly string[]): Promise<{ canceled: number; failures: Record<string, number> }> {
  const pool = new Pool(keelOrigin, { connections: concurrency, pipelining: 1 });
  let canceled = 0;
  const failures: Record<string, number> = {};
  try {
    await inBatches(ids, concurrency, async (id, index) => {
      const response = await pool.request({ path: '/a2a/hold', method: 'POST', headers: A2A_HEADERS, body: rpcBody(index, 'CancelTask', { id }) });
      const answer = JSON.parse(await response.body.text()) as { result?: { status?: { state?: string } }; error?: { message?: string } };
      if (answer.result?.status?.state === 'TASK_STATE_CANCELED') canceled += 1;
      else countError(failures, answer.error?.message ?? `state ${answer.result?.status?.state}`);
    });
  } finally {
    await pool.close().catch(() => undefined);
  }
  return { canceled, failures };
}

async function waitFor(check: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) return false;
    await sleep(100);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------

function childrenMiB(entry: Reading): string {
  if (entry.children.length === 0) return '-';
  return fmt(mib(entry.children.reduce((sum, child) => sum + child.rssKiB, 0)));
}

function shellFileLimit(): string {
  const result = spawnSync('sh', ['-c', 'echo "$(ulimit -Sn) $(ulimit -Hn)"'], { encoding: 'utf8' });
  return result.status === 0 ? result.stdout.trim().replace(' ', ' soft / ') + ' hard' : 'unknown';
}

async function main(): Promise<number> {
  const postgres = await postgresVersion();
  console.error(`${BENCH}: ${taskCount} tasks at concurrency ${concurrency}, then ${streamCount} streams (${streamMethod}); queue ${queue}`);
  return withTrackedDatabase(async (databaseUrl) => {
    const installation = newInstallation();
    let keel: KeelChild | null = null;
    const db = new pg.Client({ connectionString: databaseUrl, application_name: 'bench-memory' });
    try {
      keel = await startKeelProcess({ name: 'Keel', databaseUrl, queue, configYaml: CONFIG_YAML, inspector: forceGc, ...installation });
      keelOrigin = keel.origin;
      if (forceGc) {
        inspector = inspectorUrl(keel.child);
        if (!inspector) throw new Error(`BENCH_MEMORY_GC=1 but Keel printed no inspector URL:\n${keel.child.tail()}`);
      }
      await db.connect();
      const serving = servingProcess(keel.child.pid, keel.port);
      if (!serving) throw new Error(`no process among ${keel.child.pid} and its descendants listens on port ${keel.port}`);
      servingPid = serving.pid;
      const limits = { shell: shellFileLimit(), bench: procOpenFileLimit('self'), keel: procOpenFileLimit(servingPid) };
      const process1 = `pid ${servingPid} (${serving.command.replace(/^\S*\/node /, 'node ')})${forceGc ? ', with NODE_OPTIONS=--inspect=127.0.0.1:0' : ''}${servingPid === keel.child.pid ? ', the spawned process itself' : `, a descendant of the spawned ${keel.child.pid}`}; descendants at start: ${serving.descendants.length === 0 ? 'none' : serving.descendants.map((pid) => `${pid} (${processCommand(pid).replace(/^\S*\//, '')})`).join(', ')}`;
      console.error(`  measuring ${process1}`);
      console.error(`  open files: shell ${limits.shell}; this process ${limits.bench.soft}/${limits.bench.hard}; Keel ${limits.keel.soft}/${limits.keel.hard}`);
      const need = streamCount + 200;
      for (const [who, limit] of [['this process', limits.bench], ['Keel', limits.keel]] as const) {
        if (Number(limit.soft) < need) console.error(`  warning: ${who} may open ${limit.soft} files, ${streamCount} streams need about ${need}`);
      }

      const readings: Reading[] = [];
      readings.push(await reading('after ready'));

      console.error(`  sending ${taskCount} tasks (blocking SendMessage, echo), progress every ${progressEvery}:`);
      const tasks = await sendTasks();
      const inDatabase = (await db.query<{ completed: number; other: number }>(
        `SELECT count(*) FILTER (WHERE status = 'completed')::int AS completed, count(*) FILTER (WHERE status <> 'completed')::int AS other FROM runs WHERE agent = 'echo'`,
      )).rows[0]!;
      readings.push(await reading(`after ${taskCount} tasks`));

      // Streams.
      let holdIds: string[] = [];
      if (streamMethod === 'subscribe') {
        console.error(`  creating ${streamCount} hold tasks (returnImmediately) ...`);
        holdIds = await createHoldTasks(streamCount);
        readings.push(await reading(`${streamCount} hold tasks, no stream`));
      }
      console.error(`  opening ${streamCount} streams (${streamMethod === 'subscribe' ? 'SubscribeToTask' : 'SendStreamingMessage'}), ${openConcurrency} at a time ...`);
      const streamPool = new Pool(keelOrigin, { connections: streamCount + 8, pipelining: 1, headersTimeout: 120_000, bodyTimeout: 0, keepAliveTimeout: 1000 });
      const abort = new AbortController();
      setMaxListeners(0, abort.signal);
      const onInterrupt = () => abort.abort();
      interrupted.signal.addEventListener('abort', onInterrupt, { once: true });
      const streams: ReturnType<typeof openStream>[] = [];
      const openStarted = performance.now();
      await inBatches(Array.from({ length: streamCount }), openConcurrency, async (_item, index) => {
        const stream = openStream(streamPool, index, streamMethod === 'subscribe' ? holdIds[index]! : null, abort.signal);
        streams.push(stream);
        await stream.firstEvent;
      });
      const openSeconds = (performance.now() - openStarted) / 1000;
      const opened = streams.filter((stream) => stream.state.opened && !stream.state.ended && !stream.state.endError).length;
      const openFailures: Record<string, number> = {};
      for (const stream of streams) if (!stream.state.opened || stream.state.openError) countError(openFailures, stream.state.openError ?? stream.state.endError ?? 'no first event');
      console.error(`  ${opened} of ${streamCount} streams open (first event received) in ${fmt(openSeconds)} s`);
      const withStreams = await reading(`${streamCount} streams open`);
      readings.push(withStreams);
      const stillOpen = streams.filter((stream) => stream.state.opened && !stream.state.ended && !stream.state.endError).length;
      if (streamMethod === 'send') holdIds = streams.map((stream) => stream.state.taskId).filter((id): id is string => id !== null);

      console.error(`  closing: CancelTask on each of the ${holdIds.length} hold tasks ...`);
      const cancel = await cancelTasks(holdIds);
      const allEnded = await waitFor(() => streams.every((stream) => stream.state.ended || stream.state.endError !== null), 120_000);
      const endedCleanly = streams.filter((stream) => stream.state.ended && stream.state.endError === null && stream.state.lastState === 'TASK_STATE_CANCELED').length;
      const endFailures: Record<string, number> = {};
      for (const stream of streams) {
        if (stream.state.ended && stream.state.endError === null && stream.state.lastState === 'TASK_STATE_CANCELED') continue;
        countError(endFailures, stream.state.endError ?? (stream.state.ended ? `ended after ${stream.state.lastState}` : 'still open'));
      }
      abort.abort();
      interrupted.signal.removeEventListener('abort', onInterrupt);
      await streamPool.close().catch(() => undefined);
      console.error(`  ${endedCleanly} of ${streamCount} streams received TASK_STATE_CANCELED and were ended by the server${allEnded ? '' : ' (gave up waiting after 120 s)'}`);
      readings.push(await reading('streams closed'));
      const holdStates = (await db.query<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM a2a_tasks WHERE agent = 'hold' GROUP BY state ORDER BY state`)).rows;

      const base = readings.find((entry) => entry.stage.endsWith('no stream')) ?? readings[1]!;
      const perStreamKiB = (withStreams.rssKiB - base.rssKiB) / streamCount;
      const perStreamHeap = withStreams.heapUsedBytes !== null && base.heapUsedBytes !== null ? (withStreams.heapUsedBytes - base.heapUsedBytes) / streamCount / 1024 : null;
      const afterReady = readings[0]!;
      const afterTasks = readings[1]!;

      const lines: string[] = [''];
      lines.push('bench:memory — resident memory of one Keel process (role all, echo agent)');
      lines.push(machineLine(postgres));
      lines.push(`process: ${process1}; Postgres${queue === 'redis' ? ' and Redis are' : ' is'} external, not counted; queue ${queue}`);
      lines.push(`open files: shell ${limits.shell}; this process ${limits.bench.soft}/${limits.bench.hard}; Keel ${limits.keel.soft}/${limits.keel.hard}`);
      lines.push('');
      lines.push(`tasks: ${taskCount} blocking SendMessage at concurrency ${concurrency}: ${tasks.completed} completed, ${tasks.errors} errors, in ${fmt(tasks.seconds)} s (${fmt(tasks.completed / tasks.seconds)} tasks/s); database: ${inDatabase.completed} echo runs completed, ${inDatabase.other} not`);
      lines.push(`  ${'tasks'.padStart(8)} ${'s'.padStart(8)} ${'RSS MiB'.padStart(9)} ${'tasks/s'.padStart(9)} ${'overall'.padStart(9)} ${'errors'.padStart(7)}`);
      for (const entry of tasks.progress) {
        lines.push(`  ${String(entry.done).padStart(8)} ${fmt(entry.seconds).padStart(8)} ${fmt(mib(entry.rssKiB)).padStart(9)} ${fmt(entry.intervalRate).padStart(9)} ${fmt(entry.overallRate).padStart(9)} ${String(entry.errors).padStart(7)}`);
      }
      lines.push('');
      lines.push(`  ${'stage'.padEnd(32)} ${'RSS MiB'.padStart(9)} ${'Δ MiB'.padStart(8)} ${'peak MiB'.padStart(9)} ${'heap MiB'.padStart(9)} ${'fds'.padStart(6)} ${'sockets'.padStart(8)} ${'children MiB'.padStart(13)}`);
      for (const [index, entry] of readings.entries()) {
        const delta = index === 0 ? '' : fmt(mib(entry.rssKiB - readings[index - 1]!.rssKiB));
        const heap = entry.heapUsedBytes === null ? '-' : fmt(entry.heapUsedBytes / 2 ** 20);
        lines.push(
          `  ${entry.stage.padEnd(32)} ${fmt(mib(entry.rssKiB)).padStart(9)} ${delta.padStart(8)} ${fmt(mib(entry.hwmKiB)).padStart(9)} ${heap.padStart(9)} ${String(entry.fds).padStart(6)} ${String(entry.sockets).padStart(8)} ${childrenMiB(entry).padStart(13)}`,
        );
      }
      const childCommands = [...new Set(readings.flatMap((entry) => entry.children.map((child) => child.command.replace(/^\S*\//, ''))))];
      lines.push(`  children = RSS of processes Keel spawned, not included in its RSS: ${childCommands.length === 0 ? 'none' : childCommands.join('; ')}`);
      lines.push('');
      const heapGrowth = afterTasks.heapUsedBytes !== null && afterReady.heapUsedBytes !== null ? afterTasks.heapUsedBytes - afterReady.heapUsedBytes : null;
      lines.push(
        `growth over the tasks: RSS ${fmt(mib(afterTasks.rssKiB - afterReady.rssKiB))} MiB` +
          (heapGrowth === null ? '' : `, heap ${fmt(heapGrowth / 2 ** 20)} MiB (${fmt(heapGrowth / taskCount, 0)} bytes per task if all of it were kept per task)`) +
          '; an RSS that levels off in the progress lines is a working set, not a per-task cost',
      );
      lines.push(
        `streams: ${opened} of ${streamCount} opened (first event), ${stillOpen} still open at the reading, opened in ${fmt(openSeconds)} s; ` +
          `per stream: ${fmt(perStreamKiB)} KiB RSS${perStreamHeap === null ? '' : `, ${fmt(perStreamHeap)} KiB heap`} (against "${base.stage}"); ` +
          `Keel sockets +${withStreams.sockets - base.sockets} while open`,
      );
      lines.push(
        `closing: ${cancel.canceled} tasks cancelled; ${endedCleanly} of ${streamCount} streams got TASK_STATE_CANCELED and an orderly end from the server; ` +
          `hold tasks now ${holdStates.map((row) => `${row.state.replace('TASK_STATE_', '')} ${row.n}`).join(', ')}`,
      );
      for (const [label, kinds] of [['task errors', tasks.errorKinds], ['open failures', openFailures], ['cancel failures', cancel.failures], ['stream end failures', endFailures]] as const) {
        const entries = Object.entries(kinds).sort((a, b) => b[1] - a[1]);
        if (entries.length === 0) continue;
        lines.push(`${label}:`);
        for (const [kind, count] of entries.slice(0, 8)) lines.push(`  ${String(count).padStart(7)} × ${kind}`);
      }
      lines.push(
        `heap = keel_process_nodejs_heap_size_used_bytes from /metrics; readings after ${settleSeconds} s idle each, ` +
          (forceGc
            ? 'each after a full GC forced through the inspector (Keel runs with --inspect=127.0.0.1:0); RSS keeps pages V8 does not return, so a stage can add heap without adding RSS'
            : 'no forced GC (BENCH_MEMORY_GC=0): RSS and heap include garbage and are noisy at the MiB level'),
      );
      console.log(lines.join('\n'));

      const document = {
        bench: 'memory',
        date: new Date().toISOString(),
        machine: { cores: cpus().length, cpu: cpus()[0]?.model.trim(), node: process.version, postgres },
        queue,
        pid: servingPid,
        forcedGc: forceGc,
        limits,
        tasks: { requested: taskCount, completed: tasks.completed, errors: tasks.errors, seconds: tasks.seconds, perSecond: tasks.completed / tasks.seconds, databaseCompleted: inDatabase.completed, progress: tasks.progress },
        readings,
        streams: {
          method: streamMethod,
          requested: streamCount,
          opened,
          stillOpenAtReading: stillOpen,
          openSeconds,
          perStreamKiB,
          perStreamHeapKiB: perStreamHeap,
          socketsWhileOpen: withStreams.sockets - base.sockets,
          heapGrowthOverTasksBytes: heapGrowth,
          canceled: cancel.canceled,
          endedCleanly,
        },
      };
      console.log(
        JSON.stringify({
          bench: 'memory',
          queue,
          pid: servingPid,
          forcedGc: forceGc,
          tasks: { completed: tasks.completed, errors: tasks.errors, perSecond: tasks.completed / tasks.seconds },
          rssMiB: Object.fromEntries(readings.map((entry) => [entry.stage, Number(fmt(mib(entry.rssKiB), 1))])),
          streams: document.streams,
        }),
      );
      writeBenchJson(document);
      return 0;
    } finally {
      await db.end().catch(() => undefined);
      if (keel) {
        const code = await stopKeelProcess(keel);
        if (code !== 0) console.error(`${BENCH}: Keel exited with ${code}`);
      }
      if (queue === 'redis') await dropRedisKeys(installation.queuePrefix);
    }
  });
}

runBench(BENCH, main);
