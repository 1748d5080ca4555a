import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, platform, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import pg from 'pg';
import { fetch as undiciFetch, Pool } from 'undici';
import { SendMessageRequest, TaskState, type StreamResponse } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, type Client } from '@a2a-js/sdk/client';
import { encodeMasterKey, generateMasterKey } from '../src/sealing/master-key.js';
import {
  A2A_HEADERS,
  databaseName,
  clockTicks,
  dropRedisKeys,
  envKnobs,
  freePort,
  freePorts,
  guard,
  interrupted,
  judgeSend,
  machineLine,
  ManagedChild,
  procStat,
  redisUrl,
  repoRoot,
  rpcBody,
  runBench,
  runCommand,
  scrapeMetrics,
  sendMessageParams,
  sleep,
  startOtlpSink,
  throwIfInterrupted,
  unguard,
  waitUntilReady,
  watchdogConnected,
  withAdmin as withAdminOn,
  withTrackedDatabase as withTrackedDatabaseOn,
  writeBenchJson,
  type InterruptOptions,
} from './keel-harness.js';
import { startBenchHosts, type BenchHosts } from './bench-hosts.js';
import { startPrivatePostgres, type PrivatePostgres } from './private-postgres.js';
import { ADMIN_URL, fmt, percentile } from './support.js';

// bench:a2a — the same load against A2A servers, side by side in one run on this machine:
//   - the official @a2a-js/sdk server on its InMemoryTaskStore,
//   - the same server on its Postgres DatabaseTaskStore,
//   - Keel, default echo agent, queue on Redis or Postgres, in one or both topologies:
//       single  one `node bin/keel.js start` process (every role),
//       split   2 × `keel start --role api` + 2 × `keel start --role worker` on one database (and,
//               for the Redis queue, one Redis); the load generator's clients are spread over both
//               APIs, round-robin per client (client i always talks to API i mod 2).
// The load: blocking SendMessage over JSON-RPC, a new task per request, N concurrent clients (each
// with a connection of its own: N truly concurrent requests). Each target first serves the same
// unmeasured load (the server warm-up), then each concurrency has a warm-up and a measured window.
// Every server runs in child processes of its own, one target at a time, so neither the load
// generator nor another server shares its event loop. Every target run gets a fresh database (and a
// fresh Redis key prefix). Prints one table and, as its last line, a JSON document with every
// figure; asserts nothing (docs/performance.md gives the targets: Keel ≥ 3× the SDK on Postgres and
// ≥ 0.5× the SDK in memory, in the same run).
// The streaming mode (BENCH_MODE=streaming): SendStreamingMessage over JSON-RPC, sent by the
// official @a2a-js/sdk client (Client.sendMessageStream, one client per server origin, each request
// on a connection of the client's own as in the blocking mode), against the SDK in-memory server and
// Keel; a success is a stream that ends COMPLETED and carried the echo artifact. Its table gives
// tasks/s (streams completed a second), the time to the first event and to the stream's end (p50,
// p99), and Keel's ratios to the in-memory server: tasks/s, and first-event p50 (lower is better).
// Every message, in either mode, has a messageId of its own (randomUUID): Keel's idempotency key is
// owner + messageId, so the bench measures new messages, the path every task takes.
//
// Environment:
//   BENCH_MODE             blocking | streaming, or both: "blocking,streaming" (blocking). Both: every
//                          target of each mode in one run, a table each; the streaming mode measures
//                          the SDK in-memory server and Keel (the SDK's Postgres store is left out:
//                          its comparison is the blocking one)
//   BENCH_SECONDS          measured seconds per target and concurrency (10)
//   BENCH_WARMUP_SECONDS   warm-up seconds before each measurement (2); the window opens later when
//                          some client has not had its first answer by then (at most 30 s later)
//   BENCH_SERVER_WARMUP_SECONDS  seconds of unmeasured load at concurrency 32 for each target once,
//                          before its first measurement (5; 0: none), so that no phase measures a
//                          server whose code V8 is still compiling (see warmServer)
//   BENCH_CONCURRENCY      concurrent clients, or a list: "1,32,256" (32)
//   BENCH_ROUNDS           repeat the whole sequence of targets this many times and report the
//                          median (1); on a machine with other work going on, 3 gives steadier ratios.
//                          Each round starts one target later (round 2: the second target first,
//                          the first last), so no target is always measured in the same place.
//                          Keel's ratios to the SDK are also printed round by round, with their median
//   BENCH_TARGETS          which targets: sdk-memory,sdk-postgres,keel (all three)
//   BENCH_KEEL_TOPOLOGY    which Keel topologies: single,split (both)
//   BENCH_KEEL_QUEUE       Keel's queue backend: redis | postgres, or both: "redis,postgres" (redis;
//                          Redis at BENCH_REDIS_URL, redis://127.0.0.1:6379; the knobs every Keel
//                          bench reads are in bench/keel-harness.ts)
//   BENCH_TRACING          off | sdk | sdk-sampled, or several: "off,sdk" (off): Keel without the
//                          OpenTelemetry SDK, or with it (OTEL_EXPORTER_OTLP_ENDPOINT set: a
//                          BatchSpanProcessor exporting OTLP/HTTP protobuf to a local sink process
//                          that reads each request and discards it), recording every trace (sdk) or
//                          one in BENCH_TRACING_RATIO (sdk-sampled: OTEL_TRACES_SAMPLER
//                          parentbased_traceidratio, the usual setting at high request rates).
//                          With off and a traced mode: every Keel target once per mode in one run,
//                          and a `tracing cost` line per traced mode: tasks/s ÷ without, p50, p99
//   BENCH_TRACING_RATIO    the share of traces sdk-sampled records, from 0 to 1 (0.1)
//   BENCH_KEEL_AUTH        token | none (token): under token one client is created once per Keel run
//                          (`keel clients add bench`) and every process of it accepts its token
//   BENCH_KEEL_LOG_LEVEL   KEEL_LOG_LEVEL of the Keel children (warn)
//   BENCH_SDK_PG_POOL      pg.Pool size of the SDK's Postgres store (10, pg's default)
//   BENCH_JSON             also write the JSON document (indented) to this file
//   BENCH_POSTGRES         private | machine (private): where the bench databases live.
//                          private: a Postgres cluster of the bench's own, started for the run and
//                          removed after it, from the machine's server binaries (same major version)
//                          with the machine server's settings (shared_buffers, fsync, autovacuum, ...)
//                          except max_connections (BENCH_PG_MAX_CONNECTIONS, 500): the split topology
//                          on the Postgres queue holds more connections than a default server's 100,
//                          and the bench takes none from other work on the shared server.
//                          machine: the server at KEEL_BENCH_ADMIN_URL (bench/support.ts).
//   BENCH_POSTGRES_TRANSPORT socket | tcp (socket with the private cluster, tcp on the machine's
//                          server): how the servers on Postgres (Keel and the SDK's store alike)
//                          reach the private cluster: its Unix socket, as a client on the same
//                          machine usually connects, or loopback TCP. The bench's own connections
//                          use TCP either way (docs/decisions/0043-bench-servers-on-the-unix-socket.md).
//   BENCH_PG_BINDIR        where initdb and postgres are (/usr/lib/postgresql/<major>/bin, pg_config)
//   BENCH_PG_SETTLE_SECONDS idle seconds before and after each concurrency of a database target, so
//                          that every backend has reported its commits (11; 0: no commits/req or
//                          stmts/req column). stmts/req needs pg_stat_statements loaded: the private
//                          cluster loads it and tracks only the databases of Keel targets
//   KEEL_BENCH_ADMIN_URL   the machine's Postgres admin URL (bench/support.ts); its version and
//                          settings are the private cluster's model
//   BENCH_CPU              1: CPU milliseconds per completed task over the measured window, per
//                          process taking part (Linux only, utime+stime from /proc): the server
//                          processes summed per role (`sdk server`; `keel`, or `keel api` and
//                          `keel worker` in the split topology), the bench database's Postgres
//                          backends (`postgres`: the pids pg_stat_activity shows on it, followed
//                          through the window), on the private cluster its own processes too
//                          (`postgres bg`: postmaster, WAL writer, checkpointer, ...), Redis on the
//                          Redis queue (`redis`: the whole redis-server at BENCH_REDIS_URL's port,
//                          shared with anything else using it), and the load generator (this
//                          process). A column in the table (the total), a breakdown below it, a
//                          line after each measurement, and `cpu` in the JSON. Off (0) by default
//   BENCH_KEEL_HOSTS       1: the split topology across test hosts (Linux, root: bench/bench-hosts.ts):
//                          each of its four Keel processes in a network namespace of its own, every
//                          packet into or out of it delayed BENCH_HOST_LINK_MS (1): a round trip to
//                          Postgres, Redis or a client 2 × that longer. The bench's private cluster
//                          and a Redis of the bench's own listen on the bench's address on that
//                          network (the Keel processes connect over TCP). Needs BENCH_KEEL_TOPOLOGY
//                          =split and BENCH_POSTGRES=private (its transport is then tcp); off (0) by default
//   BENCH_KEEL_NODE_ARGS   node flags for the `keel start` processes only, space-separated, e.g.
//                          "--cpu-prof --cpu-prof-dir=/tmp/p" (relative paths: from the repo root)
//   BENCH_TOP_STATEMENTS   N: after each Keel target's run, print the N statements that took the most of
//                          Postgres's execution time on its database over the whole run (start-up
//                          and warm-up included): total ms and its share of the N, calls, mean
//                          execution ms, times planned and mean planning ms (planning is tracked
//                          for that database when N > 0). Needs pg_stat_statements, as stmts/req
//                          does (the private cluster)
//   BENCH_LOG_STATEMENTS   1: ALTER DATABASE <bench database> SET log_statement = 'all' when it is
//                          created (every target's statements in the server log; slows the server).
//                          Meant with BENCH_POSTGRES=machine: the private cluster logs to a pipe of
//                          the bench's that keeps only its last lines
//
// After each Keel measurement a `group commit:` line says where a task's two writes spent their
// time over the window, from the Keel processes' /metrics (keel_group_commit_*): writes per batch,
// how long a write waited for its batch to start, and how long a batch took (built, sealing
// included, sent, run and committed); `groupCommit` in the JSON.
// Any other KEEL_* variable in the environment reaches every Keel process (KEEL_RUNS_CONCURRENCY,
// say); the bench sets the database, master key, ports, data directory, auth mode, queue and log
// level itself.

type TargetKind = 'sdk-memory' | 'sdk-postgres' | 'keel';
type Mode = 'blocking' | 'streaming';
type Topology = 'single' | 'split';
type QueueKind = 'redis' | 'postgres';
type KeelRole = 'all' | 'api' | 'worker';
type Tracing = 'off' | 'sdk' | 'sdk-sampled';

type Measurement = {
  round: number;
  concurrency: number;
  seconds: number;
  /** The warm-up this measurement had: BENCH_WARMUP_SECONDS, or longer when the first answers took longer. */
  warmupSeconds: number;
  successes: number;
  tasksPerSecond: number;
  p50: number;
  p99: number;
  /** Streaming: the time from sending to the stream's first event, over the successes. */
  firstEventP50?: number;
  firstEventP99?: number;
  errors: number;
  errorKinds: Record<string, number>;
  /** How many server origins the clients were spread over. */
  origins: number;
  /**
   * Client side, sampled from the undici pools every 250 ms: the most requests on the wire at once
   * (= concurrency when nothing starves, give or take clients between two requests), the most
   * queued waiting for a connection (0 when nothing starves), the most connections open.
   */
  peakInFlight: number;
  peakQueued: number;
  peakConnections: number;
  /**
   * Database targets: pg_stat_database.xact_commit over this concurrency's whole phase (warm-up,
   * window, drain), read once every backend has reported (BENCH_PG_SETTLE_SECONDS), ÷ the requests
   * sent in the phase.
   */
  commitsPerRequest?: number;
  /**
   * The statements the server ran over the same phase ÷ the same requests: Keel's from
   * pg_stat_statements (top-level statements, BEGIN and COMMIT among them), the SDK store's from
   * its own counter. Not measured on the machine's server (BENCH_POSTGRES=machine).
   */
  statementsPerRequest?: number;
  /** The most backends connected to the bench database during the measurement (database targets). */
  peakBackends?: number;
  /** BENCH_CPU=1: CPU time of each group of processes over (about) the measured window. */
  cpu?: CpuFigures;
  /**
   * Keel: its group commits over (about) the measured window: writes per batch, how long a write
   * waited for its batch to start, and how long a batch took (built, sent, run and committed).
   */
  groupCommit?: GroupCommitFigures;
};

/**
 * CPU milliseconds (utime+stime) each group of processes used over `spanMs` (the measured window,
 * give or take the few ms its two samples took), and the tasks completed in that same span.
 */
type CpuFigures = { spanMs: number; tasks: number; ms: Record<string, number> };

type DatabaseWork = { requests: number; commits: number; rollbacks: number; rowsWritten: number; statements?: number };

type StartedProcess = { role: KeelRole; port: number; readyMs: number };

type TargetResult = {
  id: string;
  kind: TargetKind;
  mode: Mode;
  /** 'SDK in-memory', 'SDK Postgres', 'Keel'. */
  target: string;
  /** '1 process', 'single', 'split'. */
  topology: string;
  queue: QueueKind | null;
  /** Keel: without the OpenTelemetry SDK, or with it exporting to the local sink, every trace or a share (BENCH_TRACING). */
  tracing?: Tracing;
  unavailable?: string;
  measurements: Measurement[];
  databaseWork?: DatabaseWork;
  /** Keel: how long each process took to answer /readyz, per round. */
  startups: StartedProcess[][];
  /** Anything odd seen during a run (a process that died under load, say). */
  notes: string[];
};

const TOPOLOGY_DESCRIPTION: Record<Topology, string> = {
  single: '1 × keel start',
  split: '2 × --role api + 2 × --role worker',
};

const BENCH = 'bench:a2a';
const knobs = envKnobs(BENCH);
const fail = knobs.fail;
const keelBin = join(repoRoot, 'bin/keel.js');
const seconds = knobs.positive('BENCH_SECONDS', 10);
const warmupSeconds = knobs.nonNegative('BENCH_WARMUP_SECONDS', 2);
const serverWarmupSeconds = knobs.nonNegative('BENCH_SERVER_WARMUP_SECONDS', 5);
/** The server warm-up's clients: the concurrency the targets are compared at. */
const SERVER_WARMUP_CONCURRENCY = 32;
const rounds = knobs.positiveInt('BENCH_ROUNDS', 1);
let currentRound = 1;
const concurrencies = knobs.list('BENCH_CONCURRENCY', '32').map((item) => {
  const value = Number(item);
  if (!Number.isInteger(value) || value < 1) fail(`BENCH_CONCURRENCY: "${item}" is not a positive integer`);
  return value;
});
const modes = knobs.choices<Mode>('BENCH_MODE', 'blocking', ['blocking', 'streaming']);
const targetKinds = knobs.choices<TargetKind>('BENCH_TARGETS', 'sdk-memory,sdk-postgres,keel', ['sdk-memory', 'sdk-postgres', 'keel']);
const topologies = knobs.choices<Topology>('BENCH_KEEL_TOPOLOGY', 'single,split', ['single', 'split']);
const keelQueues = knobs.choices<QueueKind>('BENCH_KEEL_QUEUE', 'redis', ['redis', 'postgres']);
const tracingModes = knobs.choices<Tracing>('BENCH_TRACING', 'off', ['off', 'sdk', 'sdk-sampled']);
const tracingRatio = knobs.nonNegative('BENCH_TRACING_RATIO', 0.1);
if (tracingRatio > 1) fail(`BENCH_TRACING_RATIO: expected a ratio from 0 to 1, got "${process.env.BENCH_TRACING_RATIO}"`);
const keelAuthMode = knobs.choice<'token' | 'none'>('BENCH_KEEL_AUTH', 'token', ['token', 'none']);
const sdkPoolSize = knobs.positive('BENCH_SDK_PG_POOL', 10);
const keelLogLevel = process.env.BENCH_KEEL_LOG_LEVEL ?? 'warn';
const usePrivatePostgres = knobs.choice<'private' | 'machine'>('BENCH_POSTGRES', 'private', ['private', 'machine']) === 'private';
const acrossHosts = knobs.flag('BENCH_KEEL_HOSTS');
const postgresTransport = knobs.choice<'socket' | 'tcp'>('BENCH_POSTGRES_TRANSPORT', usePrivatePostgres && !acrossHosts ? 'socket' : 'tcp', ['socket', 'tcp']);
if (acrossHosts && postgresTransport === 'socket') fail('BENCH_KEEL_HOSTS: the Keel hosts reach the private cluster over TCP (BENCH_POSTGRES_TRANSPORT=tcp)');
if (postgresTransport === 'socket' && !usePrivatePostgres) fail('BENCH_POSTGRES_TRANSPORT=socket: only the private cluster\'s socket is known to the bench (BENCH_POSTGRES=private)');
const privateMaxConnections = knobs.positive('BENCH_PG_MAX_CONNECTIONS', 500);
const settleSeconds = knobs.nonNegative('BENCH_PG_SETTLE_SECONDS', 11);
const cpuEnabled = knobs.flag('BENCH_CPU');
if (cpuEnabled && platform() !== 'linux') fail('BENCH_CPU: reads /proc, so Linux only');
const keelNodeArgs = (process.env.BENCH_KEEL_NODE_ARGS ?? '').split(/\s+/).filter((arg) => arg !== '');
const logStatements = knobs.flag('BENCH_LOG_STATEMENTS');
const hostLinkMs = knobs.nonNegative('BENCH_HOST_LINK_MS', 1);
if (acrossHosts && (topologies.length !== 1 || topologies[0] !== 'split')) fail('BENCH_KEEL_HOSTS: the hosts mode runs the split topology only (BENCH_KEEL_TOPOLOGY=split)');
if (acrossHosts && !usePrivatePostgres) fail('BENCH_KEEL_HOSTS: the Keel hosts reach the private cluster only (BENCH_POSTGRES=private)');
/** The test hosts of the hosts mode, once started. */
let benchHosts: BenchHosts | null = null;
if (acrossHosts) TOPOLOGY_DESCRIPTION.split += ` across 4 test hosts, every Keel host's link delayed ${hostLinkMs} ms each way (Postgres, Redis and the clients on the bench's host)`;
/** The server the bench databases are created on: the machine's, or the private cluster once started. */
let adminUrl = ADMIN_URL;
let privatePostgres: PrivatePostgres | null = null;
/** A bench database's URL as the servers under test get it: through the private cluster's socket or over TCP (BENCH_POSTGRES_TRANSPORT). */
const serverDatabaseUrl = (url: string): string => {
  if (benchHosts) {
    // Over TCP to the cluster's address on the hosts' network.
    const parsed = new URL(url);
    parsed.hostname = benchHosts.address;
    return parsed.toString();
  }
  return postgresTransport === 'socket' && privatePostgres?.socketUrl ? privatePostgres.socketUrl(url) : url;
};
// ---------------------------------------------------------------------------------------------
// Interruption and child processes (bench/keel-harness.ts): every child runs in a process group of
// its own and is on the clean-up watchdog's list, as are the private cluster, the bench databases
// and the data directories. A second Ctrl-C kills the children at once and exits.

const interruptOptions: InterruptOptions = {
  leftBehind: () => (privatePostgres ? `remove by hand: ${privatePostgres.dataDir}` : null),
  // With a watchdog, the private cluster stays up until it has dropped the bench databases.
  onExit: () => {
    if (!watchdogConnected()) privatePostgres?.kill();
  },
};


// ---------------------------------------------------------------------------------------------
// The load.

/** The longest the measured window waits, after the warm-up, for every client's first answer. */
const MAX_WARMUP_EXTENSION_MS = 30_000;

let requestSequence = 0;

const sendMessageBody = (id: number, text: string) => rpcBody(id, 'SendMessage', sendMessageParams(text));

/** null for a completed task carrying the expected artifact text, else what went wrong. */
function judge(statusCode: number, raw: string, text: string): string | null {
  const judged = judgeSend(statusCode, raw, text, ['TASK_STATE_COMPLETED']);
  return 'error' in judged ? judged.error : null;
}

/** A request's judgement (null = success), its latency in ms and, streaming, the ms to its first event. */
type Outcome = { error: string | null; ms: number; firstEventMs?: number };

/** One blocking SendMessage; the answer's judgement (null = success) and its latency in ms. */
async function sendOne(pool: Pool, path: string, headers: Record<string, string>): Promise<Outcome> {
  const id = ++requestSequence;
  const text = `hi ${id}`;
  const body = sendMessageBody(id, text);
  const started = performance.now();
  try {
    const response = await pool.request({ path, method: 'POST', headers, body, signal: interrupted.signal });
    const raw = await response.body.text();
    return { error: judge(response.statusCode, raw, text), ms: performance.now() - started };
  } catch (error) {
    const code = (error as { code?: string }).code;
    return { error: `request failed: ${code ?? (error as Error).message}`, ms: performance.now() - started };
  }
}

const TERMINAL_STATES: ReadonlySet<TaskState> = new Set([TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED]);

/**
 * The official client for one server origin, reading the agent card at `cardPath` as any remote
 * client would (once, with the SDK's own card resolver), its A2A requests sent through `pool` (so
 * the pool's statistics see them, and each request has a connection of its own) with the target's
 * authorization header.
 */
async function streamingClient(origin: string, cardPath: string, headers: Record<string, string>, pool: Pool): Promise<Client> {
  const authorization = headers.authorization;
  const fetchImpl = ((input: string | URL, init?: RequestInit) => {
    const merged: Record<string, string> = Object.fromEntries(new Headers(init?.headers));
    if (authorization) merged.authorization = authorization;
    return undiciFetch(input, { ...(init as Parameters<typeof undiciFetch>[1]), headers: merged, dispatcher: pool });
  }) as unknown as typeof fetch;
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, { transports: [new JsonRpcTransportFactory({ fetchImpl })], preferredTransports: ['JSONRPC'] }),
  );
  return factory.createFromUrl(`${origin}${cardPath}`, '');
}

/**
 * One SendStreamingMessage through the official client, read to its end: a success is a stream
 * whose last state is COMPLETED and that carried the echo artifact's text; its latency is the
 * stream's end, and the first event's time is kept apart.
 */
async function streamOne(client: Client): Promise<Outcome> {
  const id = ++requestSequence;
  const text = `hi ${id}`;
  const expected = `echo: ${text}`;
  const request = SendMessageRequest.fromJSON(sendMessageParams(text));
  const started = performance.now();
  let firstEventMs: number | undefined;
  let state: TaskState | undefined;
  let echoed = false;
  let events = 0;
  const hasEcho = (parts: readonly { content?: { $case: string; value?: unknown } }[] | undefined) =>
    (parts ?? []).some((part) => part.content?.$case === 'text' && part.content.value === expected);
  const read = (event: StreamResponse) => {
    const payload = event.payload;
    if (payload?.$case === 'task') {
      state = payload.value.status?.state;
      if (payload.value.artifacts.some((artifact) => hasEcho(artifact.parts))) echoed = true;
    } else if (payload?.$case === 'statusUpdate') {
      state = payload.value.status?.state;
    } else if (payload?.$case === 'artifactUpdate') {
      if (hasEcho(payload.value.artifact?.parts)) echoed = true;
    }
  };
  // A signal of the stream's own, aborted with `interrupted`. Not `interrupted.signal` itself: its
  // listener limit is 0 (unlimited), and undici's fetch asks Node's getMaxListeners of it, which
  // throws on Node 20 for a limit of 0. Nor one signal shared by every stream: undici removes its
  // listener from a request's signal only when the request is garbage-collected, so a shared one
  // gathered thousands of them (MaxListenersExceededWarning, and the load generator slowed).
  const abort = new AbortController();
  const onInterrupt = () => abort.abort(interrupted.signal.reason);
  interrupted.signal.addEventListener('abort', onInterrupt, { once: true });
  try {
    for await (const event of client.sendMessageStream(request, { signal: abort.signal })) {
      firstEventMs ??= performance.now() - started;
      events += 1;
      read(event);
    }
  } catch (error) {
    // fetch's own failures ("fetch failed") say what happened in their cause.
    const cause = (error as { cause?: { code?: string; message?: string } }).cause;
    const reason = `${(error as Error).message}${cause ? ` (${cause.code ?? cause.message})` : ''}`;
    return { error: `stream failed: ${reason.slice(0, 100)}`, ms: performance.now() - started };
  } finally {
    interrupted.signal.removeEventListener('abort', onInterrupt);
  }
  const ms = performance.now() - started;
  const name = state === undefined ? '(none)' : TaskState[state];
  let error: string | null = null;
  if (events === 0) error = 'stream ended without an event';
  else if (state !== TaskState.TASK_STATE_COMPLETED) error = state !== undefined && TERMINAL_STATES.has(state) ? `task state ${name}` : `stream ended in state ${name}`;
  else if (!echoed) error = 'completed without the expected artifact text';
  return { error, ms, ...(firstEventMs !== undefined ? { firstEventMs } : {}) };
}

/** One sender per pool (pool i talks to origin i): a blocking SendMessage, or a stream through the official client. */
async function senders(target: LoadTarget, pools: readonly Pool[]): Promise<(() => Promise<Outcome>)[]> {
  if (target.mode === 'blocking') return pools.map((pool) => () => sendOne(pool, target.path, target.headers));
  return Promise.all(
    pools.map(async (pool, index) => {
      const client = await streamingClient(target.origins[index]!, target.cardPath, target.headers, pool);
      return () => streamOne(client);
    }),
  );
}

/** The pools for `concurrency` clients of the target (clientPools) and a sender for each pool; the pools are closed again when a sender cannot be made. */
async function openClients(target: LoadTarget, concurrency: number): Promise<{ pools: Pool[]; send: (() => Promise<Outcome>)[] }> {
  const pools = clientPools(target.origins, concurrency);
  try {
    return { pools, send: await senders(target, pools) };
  } catch (error) {
    await Promise.all(pools.map((pool) => pool.close().catch(() => undefined)));
    throw error;
  }
}

/**
 * What the load needs to know of a target: the mode, where to send, with which headers, its database (if any)
 * to watch, and (BENCH_CPU) the pids of its processes by group ('keel api': [...], redis: [...]).
 */
type LoadTarget = {
  mode: Mode;
  origins: string[];
  path: string;
  /** The agent card's path on each origin (the streaming mode's client reads it). */
  cardPath: string;
  headers: Record<string, string>;
  databaseName?: string;
  processes?: Record<string, number[]>;
  /** The statements the target's server has run so far, read at the phases' edges (after the idle wait). */
  statements?: () => Promise<number>;
  /** Keel: its group commits' counters so far (from every process's /metrics), read at the window's edges. */
  groupCommits?: () => Promise<GroupCommitCounters | null>;
};

type GroupCommitKind = 'creation' | 'completion';
/** Running totals of Keel's group-commit histograms (src/metrics/hot-path-metrics.ts), summed over its processes. */
type GroupCommitCounters = Record<GroupCommitKind, { batches: number; writes: number; waitSeconds: number; writeSeconds: number }>;
/** Over a measured window, per kind: batches, writes per batch, and the mean wait and batch time in ms. */
type GroupCommitFigures = Record<GroupCommitKind, { batches: number; perBatch: number; waitMs: number; writeMs: number }>;

const GROUP_COMMIT_KINDS: readonly GroupCommitKind[] = ['creation', 'completion'];

/** The group-commit counters of the Keel processes at `origins`, summed; null when one could not be read. */
async function groupCommitCounters(origins: readonly string[]): Promise<GroupCommitCounters | null> {
  const scraped = await Promise.all(origins.map((origin) => scrapeMetrics(origin)));
  if (scraped.some((series) => series === null)) return null;
  const sum = (name: string, kind: GroupCommitKind) => scraped.reduce((total, series) => total + (series!.get(`${name}{kind="${kind}"}`) ?? 0), 0);
  return Object.fromEntries(
    GROUP_COMMIT_KINDS.map((kind) => [
      kind,
      {
        batches: sum('keel_group_commit_batch_size_count', kind),
        writes: sum('keel_group_commit_batch_size_sum', kind),
        waitSeconds: sum('keel_group_commit_wait_seconds_sum', kind),
        writeSeconds: sum('keel_group_commit_write_seconds_sum', kind),
      },
    ]),
  ) as GroupCommitCounters;
}

function groupCommitFigures(before: GroupCommitCounters, after: GroupCommitCounters): GroupCommitFigures {
  const per = (value: number, count: number) => (count > 0 ? value / count : Number.NaN);
  return Object.fromEntries(
    GROUP_COMMIT_KINDS.map((kind) => {
      const batches = after[kind].batches - before[kind].batches;
      const writes = after[kind].writes - before[kind].writes;
      return [
        kind,
        {
          batches,
          perBatch: per(writes, batches),
          waitMs: per((after[kind].waitSeconds - before[kind].waitSeconds) * 1000, writes),
          writeMs: per((after[kind].writeSeconds - before[kind].writeSeconds) * 1000, batches),
        },
      ];
    }),
  ) as GroupCommitFigures;
}

function groupCommitText(figures: GroupCommitFigures): string {
  return GROUP_COMMIT_KINDS.map((kind) => {
    const { perBatch, waitMs, writeMs } = figures[kind];
    return `${kind} ${fmt(perBatch, 1)} a batch, wait ${ms(waitMs, 2)} ms, write ${ms(writeMs, 2)} ms`;
  }).join('; ');
}

/** One undici pool per origin, with a connection for each of the clients that talk to it (client i to origin i mod n). */
function clientPools(origins: readonly string[], concurrency: number): Pool[] {
  const clientsOf = origins.map((_, index) => Math.floor(concurrency / origins.length) + (index < concurrency % origins.length ? 1 : 0));
  return origins.map(
    (origin, index) =>
      new Pool(origin, {
        connections: Math.max(1, clientsOf[index]!),
        pipelining: 1,
        keepAliveTimeout: 30_000,
        headersTimeout: 120_000,
        bodyTimeout: 120_000,
      }),
  );
}

/**
 * The same unmeasured load for every target before its first measured phase:
 * BENCH_SERVER_WARMUP_SECONDS of requests from SERVER_WARMUP_CONCURRENCY clients. Without it the
 * first phase measures a cold server: V8 still compiling its code (a lone client sends a few hundred
 * requests in a 2 s warm-up, far fewer than V8 needs to optimize a request's path) and Postgres's
 * backends still filling their caches and plans; whichever phase came first looked slower. Returns
 * the requests sent (the whole-run database figures count them).
 */
async function warmServer(target: LoadTarget): Promise<number> {
  if (serverWarmupSeconds === 0) return 0;
  const { pools, send } = await openClients(target, SERVER_WARMUP_CONCURRENCY);
  let requests = 0;
  let errors = 0;
  const until = performance.now() + serverWarmupSeconds * 1000;
  const client = async (index: number) => {
    const sendOne = send[index % pools.length]!;
    while (!interrupted.signal.aborted && performance.now() < until) {
      const { error } = await sendOne();
      requests += 1;
      if (error !== null) errors += 1;
    }
  };
  try {
    await Promise.all(Array.from({ length: SERVER_WARMUP_CONCURRENCY }, (_, index) => client(index)));
  } finally {
    await Promise.all(pools.map((pool) => pool.close().catch(() => undefined)));
  }
  throwIfInterrupted();
  process.stderr.write(` ${requests} requests${errors > 0 ? `, ${errors} errors` : ''}\n`);
  return requests;
}

async function measure(target: LoadTarget, concurrency: number, round: number): Promise<{ measurement: Measurement; requests: number }> {
  // Client i talks to origin i mod n, over a connection of its own: one pool per origin with as many
  // connections as it has clients, no pipelining, so `concurrency` requests are truly in flight at
  // once (undici's default Agent, and fetch, would cap nothing here either, but a pool sized by hand
  // makes it visible: peakInFlight, peakQueued and peakConnections below).
  const { pools, send } = await openClients(target, concurrency);
  const probe = target.databaseName ? await DatabaseProbe.open(target.databaseName) : null;
  // BENCH_CPU: the span is the measured window; its tasks, the successes completed in the span.
  const successTimes: number[] = [];
  const meter =
    cpuEnabled && target.processes
      ? new CpuMeter(target.processes, probe, (from, to) => successTimes.filter((at) => at >= from && at <= to).length)
      : null;
  // Timers at the window's edges: the CPU meter and Keel's group-commit counters start and stop there.
  const windowTimers: NodeJS.Timeout[] = [];
  const begin = performance.now();
  // The measured window opens after the warm-up, and not before every client has had its first
  // answer: at high concurrency the first wave (all clients at once, cold caches, a queue backlog)
  // can take longer than the warm-up, and a window opened during it would cut off the latencies
  // longer than the time since the start. Capped, so one stuck request cannot hold the window shut.
  const warmupEnd = begin + warmupSeconds * 1000;
  let windowStart = Number.POSITIVE_INFINITY;
  let windowEnd = Number.POSITIVE_INFINITY;
  let firstAnswers = 0;
  let groupCommitsAtStart: Promise<GroupCommitCounters | null> | null = null;
  let groupCommitsAtEnd: Promise<GroupCommitCounters | null> | null = null;
  const readGroupCommits = target.groupCommits;
  const openWindow = (at: number) => {
    if (windowStart !== Number.POSITIVE_INFINITY) return;
    windowStart = at;
    windowEnd = at + seconds * 1000;
    if (readGroupCommits) {
      windowTimers.push(setTimeout(() => (groupCommitsAtStart = readGroupCommits()), Math.max(0, windowStart - performance.now())));
      windowTimers.push(setTimeout(() => (groupCommitsAtEnd = readGroupCommits()), Math.max(0, windowEnd - performance.now())));
    }
    if (meter) {
      windowTimers.push(setTimeout(() => meter.start(), Math.max(0, windowStart - performance.now())));
      windowTimers.push(setTimeout(() => void meter.stop().catch(() => undefined), Math.max(0, windowEnd - performance.now())));
    }
  };
  const cap = setTimeout(() => openWindow(performance.now()), warmupSeconds * 1000 + MAX_WARMUP_EXTENSION_MS);
  const latencies: number[] = [];
  const firstEvents: number[] = [];
  const errorKinds: Record<string, number> = {};
  let errors = 0;
  let requests = 0;
  let peakInFlight = 0;
  let peakQueued = 0;
  let peakConnections = 0;
  const client = async (index: number) => {
    const sendOne = send[index % pools.length]!;
    let answered = false;
    while (!interrupted.signal.aborted && performance.now() < windowEnd) {
      const { error, ms, firstEventMs } = await sendOne();
      requests += 1;
      const finished = performance.now();
      if (!answered) {
        answered = true;
        firstAnswers += 1;
        if (firstAnswers === concurrency) openWindow(Math.max(finished, warmupEnd));
      }
      if (meter && error === null) successTimes.push(finished);
      // A request counts in the window it completes in; the warm-up and the drain after the
      // window are load, not measurement.
      if (finished < windowStart || finished > windowEnd) continue;
      if (error === null) {
        latencies.push(ms);
        if (firstEventMs !== undefined) firstEvents.push(firstEventMs);
      } else {
        errors += 1;
        errorKinds[error] = (errorKinds[error] ?? 0) + 1;
      }
    }
  };
  // Samples: the pools' own view (dispatched vs queued for a connection) and the database's.
  const sampler = setInterval(() => {
    let running = 0;
    let queued = 0;
    let connected = 0;
    for (const pool of pools) {
      const stats = pool.stats;
      running += stats.running;
      queued += stats.queued;
      connected += stats.connected;
    }
    peakInFlight = Math.max(peakInFlight, running);
    peakQueued = Math.max(peakQueued, queued);
    peakConnections = Math.max(peakConnections, connected);
    probe?.sampleBackends();
    meter?.poll();
  }, 250);
  let cpu: CpuFigures | undefined;
  let groupCommit: GroupCommitFigures | undefined;
  try {
    await Promise.all(Array.from({ length: concurrency }, (_, index) => client(index)));
    // Closed at the window's end already, unless the last answers beat the timer to it.
    if (meter && !interrupted.signal.aborted) {
      cpu = await meter.stop().catch((error: Error) => {
        process.stderr.write(` (BENCH_CPU: no figures: ${error.message})`);
        return undefined;
      });
    }
    // The window's end, unless the last answers beat the timer to it.
    if (readGroupCommits && groupCommitsAtStart !== null && groupCommitsAtEnd === null) groupCommitsAtEnd = readGroupCommits();
    const [atStart, atEnd] = await Promise.all([groupCommitsAtStart, groupCommitsAtEnd]);
    if (atStart && atEnd) groupCommit = groupCommitFigures(atStart, atEnd);
  } finally {
    clearInterval(sampler);
    clearTimeout(cap);
    for (const timer of windowTimers) clearTimeout(timer);
    await Promise.all(pools.map((pool) => pool.close().catch(() => undefined)));
    await probe?.close();
  }
  throwIfInterrupted();
  latencies.sort((a, b) => a - b);
  firstEvents.sort((a, b) => a - b);
  return {
    requests,
    measurement: {
      round,
      concurrency,
      seconds,
      warmupSeconds: Math.round(windowStart - begin) / 1000,
      successes: latencies.length,
      tasksPerSecond: latencies.length / seconds,
      p50: percentile(latencies, 50),
      p99: percentile(latencies, 99),
      ...(target.mode === 'streaming' ? { firstEventP50: percentile(firstEvents, 50), firstEventP99: percentile(firstEvents, 99) } : {}),
      errors,
      errorKinds,
      origins: target.origins.length,
      peakInFlight,
      peakQueued,
      peakConnections,
      ...(probe ? { peakBackends: probe.peakBackends } : {}),
      ...(cpu ? { cpu } : {}),
      ...(groupCommit ? { groupCommit } : {}),
    },
  };
}

async function runLoad(result: TargetResult, target: LoadTarget): Promise<number> {
  let requests = 0;
  if (serverWarmupSeconds > 0) {
    process.stderr.write(`  ${rowLabel(result)}: server warm-up, ${serverWarmupSeconds} s at concurrency ${SERVER_WARMUP_CONCURRENCY}, unmeasured ...`);
    requests += await warmServer(target);
  }
  // The commit counter of the bench database, read only when every backend has reported (see settle).
  let commits = target.databaseName && settleSeconds > 0 ? await settle(target.databaseName) : null;
  let statements = commits !== null && target.statements ? await target.statements() : null;
  for (const concurrency of concurrencies) {
    await checkpoint();
    const roundNote = rounds > 1 ? `round ${currentRound}/${rounds}, ` : '';
    process.stderr.write(`  ${rowLabel(result)}: ${roundNote}concurrency ${concurrency}, ${warmupSeconds} s warm-up + ${seconds} s ...`);
    const { measurement, requests: sent } = await measure(target, concurrency, currentRound);
    requests += sent;
    if (commits !== null && target.databaseName) {
      const after = await settle(target.databaseName);
      if (sent > 0) measurement.commitsPerRequest = (after - commits) / sent;
      commits = after;
      if (statements !== null && target.statements) {
        const ran = await target.statements();
        if (sent > 0) measurement.statementsPerRequest = (ran - statements) / sent;
        statements = ran;
      }
    }
    result.measurements.push(measurement);
    const extra = [
      measurement.statementsPerRequest !== undefined ? `${fmt(measurement.statementsPerRequest, 2)} statements/request` : null,
      measurement.commitsPerRequest !== undefined ? `${fmt(measurement.commitsPerRequest, 2)} commits/request` : null,
      measurement.peakBackends !== undefined ? `≤ ${measurement.peakBackends} db connections` : null,
      `client side ≤ ${measurement.peakInFlight} in flight on ${measurement.peakConnections} connections${measurement.peakQueued > 0 ? `, ≤ ${measurement.peakQueued} queued` : ''}`,
    ].filter((item) => item !== null);
    if (measurement.firstEventP50 !== undefined) extra.unshift(`first event p50 ${ms(measurement.firstEventP50)} ms`);
    if (measurement.warmupSeconds > warmupSeconds + 0.05) extra.push(`warm-up ${fmt(measurement.warmupSeconds)} s, until every client's first answer`);
    process.stderr.write(` ${fmt(measurement.tasksPerSecond)} tasks/s, ${measurement.errors} errors (${extra.join(', ')})\n`);
    if (measurement.cpu) {
      const cpu = measurement.cpu;
      process.stderr.write(`    CPU ms/task: ${cpuText(cpuPerTask(cpu))}; ${cpu.tasks} tasks in ${fmt(cpu.spanMs / 1000, 2)} s\n`);
    }
    if (measurement.groupCommit) process.stderr.write(`    group commit: ${groupCommitText(measurement.groupCommit)}\n`);
  }
  return requests;
}

/**
 * The bench database's commit counter once every backend has reported its transactions. A backend
 * reports to pg_stat_database at most once a second, and under load often much later: its report
 * skips a busy lock and is retried when the backend is next idle for PGSTAT_IDLE_INTERVAL (10 s),
 * or after 60 s at the latest; seen here as thousands of commits of a load arriving at its end. So
 * the counter is read after the servers have been idle (but for their background work) for
 * BENCH_PG_SETTLE_SECONDS (11).
 */
async function settle(name: string): Promise<number> {
  await sleep(settleSeconds * 1000);
  return (await databaseCounters(name)).commits;
}

// ---------------------------------------------------------------------------------------------
// Postgres side: a checkpoint before each measurement (so no target inherits another's dirty
// pages), and the bench database's own counters for the work each task cost.

/** An admin connection to the server the bench databases are on (the private cluster once started). */
const withAdmin = <T>(fn: (client: pg.Client) => Promise<T>): Promise<T> => withAdminOn(fn, adminUrl);

async function checkpoint(): Promise<void> {
  await withAdmin((client) => client.query('CHECKPOINT')).catch(() => undefined);
}

type DatabaseCounters = { commits: number; rollbacks: number; rowsWritten: number; backends: number };

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

let statementCounting: Promise<boolean> | null = null;

/**
 * Whether the server counts statements: the private cluster loads pg_stat_statements, tracking
 * nothing until a database asks (private-postgres.ts); the machine's server usually does not.
 */
function countsStatements(): Promise<boolean> {
  statementCounting ??= withAdmin(async (client) => {
    const { rows } = await client.query<{ libraries: string }>(`SELECT current_setting('shared_preload_libraries') AS libraries`);
    if (!(rows[0]?.libraries ?? '').split(',').some((library) => library.trim() === 'pg_stat_statements')) return false;
    await client.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    return true;
  }).catch(() => false);
  return statementCounting;
}

/** Counts the top-level statements of sessions opened on the database from now on (BEGIN, COMMIT and the like among them). */
async function trackStatements(name: string): Promise<void> {
  await withAdmin(async (client) => {
    await client.query(`ALTER DATABASE ${name} SET pg_stat_statements.track = 'top'`);
    // The top statements' planning time too (it costs a little for every statement).
    if (Number(process.env.BENCH_TOP_STATEMENTS ?? 0) > 0) await client.query(`ALTER DATABASE ${name} SET pg_stat_statements.track_planning = on`);
  });
}

/** The statements run on the database so far, as pg_stat_statements counts them (each entry's calls). */
async function statementsRun(name: string): Promise<number> {
  return withAdmin(async (client) => {
    const { rows } = await client.query<{ calls: string }>(
      `SELECT coalesce(sum(s.calls), 0) AS calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1`,
      [name],
    );
    return Number(rows[0]?.calls ?? 0);
  });
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
  return withTrackedDatabaseOn(async (url) => {
    // Before anything connects to it: the setting applies to sessions started after it.
    if (logStatements) await withAdmin((client) => client.query(`ALTER DATABASE ${databaseName(url)} SET log_statement = 'all'`));
    return fn(url);
  }, adminUrl);
}

/** One admin connection watching a bench database during a measurement: the most backends connected to it. */
class DatabaseProbe {
  peakBackends = 0;
  private sampling: Promise<void> | null = null;

  private constructor(
    private readonly client: pg.Client,
    private readonly name: string,
  ) {}

  static async open(name: string): Promise<DatabaseProbe> {
    const client = new pg.Client({ connectionString: adminUrl, application_name: 'bench-a2a-probe' });
    await client.connect();
    return new DatabaseProbe(client, name);
  }

  sampleBackends(): void {
    if (this.sampling) return;
    this.sampling = this.client
      .query<{ n: number }>('SELECT numbackends AS n FROM pg_stat_database WHERE datname = $1', [this.name])
      .then(({ rows }) => {
        this.peakBackends = Math.max(this.peakBackends, rows[0]?.n ?? 0);
      })
      .catch(() => undefined)
      .finally(() => {
        this.sampling = null;
      });
  }

  /**
   * BENCH_CPU: the bench database's backends (`postgres`: client backends, autovacuum workers) and,
   * on the private cluster, its own processes (`postgres bg`: the postmaster and the background
   * processes, which pg_stat_activity lists without a database). Not the bench's admin connections.
   */
  async cpuPids(): Promise<Record<string, number[]>> {
    // One query at a time on the probe's connection (pg queues a second one, and warns).
    await this.sampling;
    const { rows } = await this.client.query<{ pid: number; background: boolean }>(
      'SELECT pid, datname IS NULL AS background FROM pg_stat_activity WHERE datname = $1 OR ($2 AND datname IS NULL)',
      [this.name, privatePostgres !== null],
    );
    const groups: Record<string, number[]> = { postgres: rows.filter((row) => !row.background).map((row) => row.pid) };
    if (privatePostgres) groups['postgres bg'] = [privatePostgres.pid, ...rows.filter((row) => row.background).map((row) => row.pid)];
    return groups;
  }

  async close(): Promise<void> {
    await this.client.end().catch(() => undefined);
  }
}

// ---------------------------------------------------------------------------------------------
// CPU per task (BENCH_CPU=1): utime+stime of every process taking part, from /proc.

/** The order groups are printed in. */
const CPU_GROUPS = ['sdk server', 'keel', 'keel api', 'keel worker', 'postgres', 'postgres bg', 'redis', 'load generator'];

function uptimeTicks(): number {
  return Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]) * clockTicks();
}

/** The redis-server processes of BENCH_REDIS_URL's port on this machine, by their command line ("redis-server 127.0.0.1:6379"). */
function redisPids(): number[] {
  const port = new URL(redisUrl).port || '6379';
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').replaceAll('\0', ' ');
      if (/^\S*redis-server\s/.test(cmdline) && cmdline.includes(`:${port}`)) pids.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return pids;
}

/**
 * The CPU time of groups of processes over a span: fixed pids (the servers, Redis), the database's
 * (asked of pg_stat_activity at the start, every poll and the end: a backend that connects during
 * the span counts from its start, one that leaves with what it had used when last seen), and this
 * process (the load generator, process.cpuUsage()).
 */
class CpuMeter {
  private readonly pids = new Map<number, { group: string; base: number; last: number }>();
  private readonly groupNames = new Set<string>();
  private running = false;
  private polling = false;
  private bootTicksAtStart = 0;
  private startedAt = 0;
  private ownBase: NodeJS.CpuUsage | undefined;
  private started: Promise<void> | undefined;
  private stopped: Promise<CpuFigures> | undefined;

  constructor(
    private readonly fixed: Record<string, number[]>,
    private readonly probe: DatabaseProbe | null,
    /** Tasks completed between two performance.now() instants. */
    private readonly tasksBetween: (from: number, to: number) => number,
  ) {}

  /** Opens the span (once). */
  start(): void {
    if (this.started) return;
    this.started = (async () => {
      const groups = await this.groups();
      this.bootTicksAtStart = uptimeTicks();
      this.track(groups);
      this.ownBase = process.cpuUsage();
      this.startedAt = performance.now();
      this.running = true;
    })();
    // Awaited by stop(); a failure surfaces there.
    this.started.catch(() => undefined);
  }

  /** Between start and stop: picks up backends that connected since, and the last figures of all. */
  poll(): void {
    if (!this.running || this.polling) return;
    this.polling = true;
    this.groups()
      .then((groups) => this.running && this.track(groups))
      .catch(() => undefined)
      .finally(() => (this.polling = false));
  }

  /** Closes the span (once); its figures. */
  stop(): Promise<CpuFigures> {
    this.start();
    this.stopped ??= (async () => {
      await this.started;
      const groups = await this.groups();
      this.track(groups);
      // One more look at those no longer listed (a backend that left keeps its last figure).
      for (const [pid, item] of this.pids) {
        const stat = procStat(pid);
        if (stat) item.last = stat.ticks;
      }
      const own = process.cpuUsage(this.ownBase);
      const endedAt = performance.now();
      this.running = false;
      const ms: Record<string, number> = {};
      for (const name of this.groupNames) ms[name] = 0;
      for (const item of this.pids.values()) ms[item.group] = (ms[item.group] ?? 0) + ((item.last - item.base) * 1000) / clockTicks();
      ms['load generator'] = (own.user + own.system) / 1000;
      const ordered = Object.fromEntries(Object.entries(ms).sort(([a], [b]) => cpuGroupRank(a) - cpuGroupRank(b)));
      return { spanMs: endedAt - this.startedAt, tasks: this.tasksBetween(this.startedAt, endedAt), ms: ordered };
    })();
    return this.stopped;
  }

  private async groups(): Promise<Record<string, number[]>> {
    return { ...this.fixed, ...(this.probe ? await this.probe.cpuPids() : {}) };
  }

  private track(groups: Record<string, number[]>): void {
    for (const [group, pids] of Object.entries(groups)) {
      this.groupNames.add(group);
      for (const pid of pids) {
        const stat = procStat(pid);
        if (!stat) continue;
        const known = this.pids.get(pid);
        if (known) known.last = stat.ticks;
        // Seen first after the start: a process started since counts from zero.
        else this.pids.set(pid, { group, base: this.running && stat.startTicks >= this.bootTicksAtStart ? 0 : stat.ticks, last: stat.ticks });
      }
    }
  }
}

function cpuGroupRank(name: string): number {
  const index = CPU_GROUPS.indexOf(name);
  return index === -1 ? CPU_GROUPS.length : index;
}

type CpuPerTask = { msPerTask: Record<string, number>; total: number; coresBusy: number };

/** Per completed task (NaN without one), and how many cores all of it kept busy on average. */
function cpuPerTask(cpu: CpuFigures): CpuPerTask {
  const per = (value: number) => (cpu.tasks > 0 ? value / cpu.tasks : Number.NaN);
  const totalMs = Object.values(cpu.ms).reduce((sum, value) => sum + value, 0);
  return {
    msPerTask: Object.fromEntries(Object.entries(cpu.ms).map(([name, value]) => [name, per(value)])),
    total: per(totalMs),
    coresBusy: cpu.spanMs > 0 ? totalMs / cpu.spanMs : Number.NaN,
  };
}

function cpuText(cpu: CpuPerTask): string {
  const parts = Object.entries(cpu.msPerTask).map(([name, value]) => `${name} ${ms(value, 2)}`);
  return `${parts.join(', ')}; total ${ms(cpu.total, 2)} (${fmt(cpu.coresBusy, 2)} of ${cpus().length} cores busy)`;
}

// ---------------------------------------------------------------------------------------------
// The targets.

const SDK_CARD_PATH = '/.well-known/agent-card.json';
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

function sdkProcesses(child: ManagedChild): Record<string, number[]> {
  return { 'sdk server': child.process.pid === undefined ? [] : [child.process.pid] };
}

async function benchSdkMemory(result: TargetResult): Promise<void> {
  const { child, origin } = await startSdkServer('memory');
  try {
    await runLoad(result, { mode: result.mode, origins: [origin], path: '/', cardPath: SDK_CARD_PATH, headers: A2A_HEADERS, processes: sdkProcesses(child) });
  } finally {
    await child.stop();
  }
}

async function benchSdkPostgres(result: TargetResult): Promise<void> {
  await withTrackedDatabase(async (databaseUrl) => {
    // The store's table comes from the SDK's own migration tool, as its docs ask.
    await promisify(execFile)(process.execPath, [a2aDbScript, 'upgrade', '--url', databaseUrl, '--store', 'tasks'], { cwd: repoRoot });
    const { child, origin } = await startSdkServer('postgres', serverDatabaseUrl(databaseUrl));
    let requests = 0;
    let statements = 0;
    let before: DatabaseCounters | undefined;
    try {
      await sleep(1200);
      before = await databaseCounters(databaseName(databaseUrl));
      const statementsBefore = await sdkStatements(origin);
      requests = await runLoad(result, {
        mode: result.mode,
        origins: [origin],
        path: '/',
        cardPath: SDK_CARD_PATH,
        headers: A2A_HEADERS,
        databaseName: databaseName(databaseUrl),
        processes: sdkProcesses(child),
        statements: () => sdkStatements(origin),
      });
      statements = (await sdkStatements(origin)) - statementsBefore;
    } finally {
      await child.stop();
    }
    if (before) addDatabaseWork(result, before, await settledCounters(databaseName(databaseUrl)), requests, statements);
  });
}

type KeelNode = { role: KeelRole; port: number; origin: string; child: ManagedChild };

/**
 * One Keel installation on a fresh database: migrated and (under token auth) given one client by
 * the CLI, then its processes started together. Every process gets the same database, master key
 * (KEEL_MASTER_KEY), data directory, queue backend and prefix, and a port of its own
 * (KEEL_SERVER_PORT; a worker listens too, for /healthz, /readyz and /metrics).
 */
async function benchKeel(result: TargetResult, topology: Topology, queue: QueueKind, tracing: Tracing): Promise<void> {
  await withTrackedDatabase(async (databaseUrl) => {
    const dataDir = mkdtempSync(join(tmpdir(), 'keel-bench-a2a-'));
    guard({ kind: 'dir', path: dataDir });
    const configFile = join(dataDir, 'bench.config.yaml');
    // An empty config file, so a keel.config.yaml in the working directory cannot change the run.
    writeFileSync(configFile, '# bench:a2a: everything comes from the environment\n');
    const queuePrefix = `bencha2a${randomBytes(4).toString('hex')}`;
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      KEEL_CONFIG: configFile,
      KEEL_DATABASE_URL: serverDatabaseUrl(databaseUrl),
      KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()),
      KEEL_SERVER_HOST: benchHosts ? '0.0.0.0' : '127.0.0.1',
      KEEL_DATA_DIR: dataDir,
      KEEL_AUTH_MODE: keelAuthMode,
      KEEL_QUEUE_PREFIX: queuePrefix,
      KEEL_LOG_LEVEL: keelLogLevel,
    };
    delete env.KEEL_SERVER_PORT;
    delete env.KEEL_QUEUE_REDIS_URL;
    delete env.KEEL_SECURITY_MASTER_KEY_FILE;
    if (queue === 'redis') env.KEEL_QUEUE_REDIS_URL = benchHosts?.redisUrl ?? redisUrl;
    // Tracing is what BENCH_TRACING says, whatever OTEL_* or KEEL_TELEMETRY_* the bench was started with.
    for (const name of Object.keys(env)) if (name.startsWith('OTEL_') || name.startsWith('KEEL_TELEMETRY_')) delete env[name];
    const sink = tracing !== 'off' ? await startOtlpSink() : null;
    if (sink) env.OTEL_EXPORTER_OTLP_ENDPOINT = sink.origin;
    if (tracing === 'sdk-sampled') {
      env.OTEL_TRACES_SAMPLER = 'parentbased_traceidratio';
      env.OTEL_TRACES_SAMPLER_ARG = String(tracingRatio);
    }

    const roles: KeelRole[] = topology === 'single' ? ['all'] : ['api', 'api', 'worker', 'worker'];
    const nodes: KeelNode[] = [];
    let requests = 0;
    let before: DatabaseCounters | undefined;
    // Before anything connects to the database: a session reads the setting when it starts.
    const counting = await countsStatements();
    if (counting) await trackStatements(databaseName(databaseUrl));
    let statementsBefore: number | undefined;
    try {
      // Migrations once, before the processes start (they would serialize on an advisory lock anyway).
      await runCommand('keel migrate', [keelBin, 'migrate'], env);
      const headers: Record<string, string> = { ...A2A_HEADERS };
      if (keelAuthMode === 'token') {
        const token = (await runCommand('keel clients add', [keelBin, 'clients', 'add', 'bench'], env)).trim();
        if (!/^keel_\S+$/.test(token)) throw new Error('keel clients add printed no token');
        headers.authorization = `Bearer ${token}`;
      }

      const ports = benchHosts ? roles.map(() => 8080) : await freePorts(roles.length);
      const startedAt = Date.now();
      const starting = roles.map(async (role, index) => {
        const port = ports[index]!;
        // In the hosts mode each process on a host of its own (`ip netns exec` execs node: the child is Keel).
        const host = benchHosts?.hosts[index];
        const origin = `http://${host?.address ?? '127.0.0.1'}:${port}`;
        const name = topology === 'single' ? 'Keel' : `Keel --role ${role} ${host ? `on ${host.name} ` : ''}:${port}`;
        const command = [...keelNodeArgs, keelBin, 'start', '--role', role];
        const child = host
          ? new ManagedChild(name, 'ip', ['netns', 'exec', host.netns, process.execPath, ...command], { env: { ...env, KEEL_SERVER_PORT: String(port) } })
          : new ManagedChild(name, process.execPath, command, { env: { ...env, KEEL_SERVER_PORT: String(port) } });
        nodes.push({ role, port, origin, child });
        await waitUntilReady(child, `${origin}/readyz`, 90_000);
        return { role, port, readyMs: Date.now() - startedAt };
      });
      const started = await Promise.allSettled(starting);
      const failed = started.find((outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected');
      if (failed) throw failed.reason;
      const startup = started.map((outcome) => (outcome as PromiseFulfilledResult<StartedProcess>).value);
      result.startups.push(startup);
      process.stderr.write(`  ${rowLabel(result)}: ready in ${startup.map((item) => `${item.role} ${fmt(item.readyMs / 1000)} s`).join(', ')}\n`);

      const apis = nodes.filter((node) => node.role !== 'worker');
      for (const api of apis) {
        const probe = await fetch(`${api.origin}/a2a/echo`, { method: 'POST', headers, body: sendMessageBody(0, 'probe') });
        const probeBody = await probe.text();
        if (probe.status === 404) {
          result.unavailable = `POST /a2a/echo answered 404 (Keel's A2A server is not built yet)`;
          return;
        }
        const probeError = judge(probe.status, probeBody, 'probe');
        if (probeError) console.error(`  ${api.child.name}: the probe request failed (${probeError}); measuring anyway`);
      }
      await sleep(1200);
      before = await databaseCounters(databaseName(databaseUrl));
      if (counting) statementsBefore = await statementsRun(databaseName(databaseUrl));
      let processes: Record<string, number[]> | undefined;
      if (cpuEnabled) {
        // Summed per role: `keel` (single), or `keel api` and `keel worker` (split).
        processes = {};
        for (const node of nodes) {
          const group = node.role === 'all' ? 'keel' : `keel ${node.role}`;
          if (node.child.process.pid !== undefined) (processes[group] ??= []).push(node.child.process.pid);
        }
        if (queue === 'redis') {
          const redis = redisPids();
          if (redis.length > 0) processes.redis = redis;
          else if (currentRound === 1) result.notes.push(`BENCH_CPU: no redis-server of ${redisUrl} found on this machine; Redis's CPU is not counted`);
        }
      }
      requests = await runLoad(result, {
        mode: result.mode,
        origins: apis.map((api) => api.origin),
        path: '/a2a/echo',
        cardPath: '/a2a/echo/.well-known/agent-card.json',
        headers,
        databaseName: databaseName(databaseUrl),
        ...(processes ? { processes } : {}),
        ...(counting ? { statements: () => statementsRun(databaseName(databaseUrl)) } : {}),
        groupCommits: () => groupCommitCounters(nodes.map((node) => node.origin)),
      });
      const erred = result.measurements.some((m) => m.round === currentRound && m.errors > 0);
      for (const node of nodes) {
        // A process that died, or the last words of each when requests failed (its warnings and errors).
        const tail = node.child
          .tail(erred ? 8 : 15)
          .split('\n')
          .map((line) => (line.length > 400 ? `${line.slice(0, 400)} …` : line))
          .join('\n');
        if (!node.child.running) result.notes.push(`round ${currentRound}: ${node.child.name} exited during the load:\n${tail}`);
        else if (erred && tail !== '') result.notes.push(`round ${currentRound}: requests failed; the last output of ${node.child.name}:\n${tail}`);
      }
    } finally {
      // All at once: the APIs' blocking waits are over (the load has drained), the workers drain their own.
      await Promise.all(nodes.map((node) => node.child.stop(15_000)));
      if (sink) {
        // After the Keels' graceful shutdown: their last spans are flushed.
        const stats = (await fetch(`${sink.origin}/stats`).then((response) => response.json(), () => null)) as { requests: number; bytes: number } | null;
        if (stats) result.notes.push(`round ${currentRound}: the OTLP sink received ${stats.requests} export requests, ${fmt(stats.bytes / 1024 / 1024, 1)} MiB of spans`);
        await sink.child.stop(5_000);
      }
      if (queue === 'redis' && !benchHosts) await dropRedisKeys(queuePrefix);
      rmSync(dataDir, { recursive: true, force: true });
      unguard({ kind: 'dir', path: dataDir });
    }
    if (before) {
      const after = await settledCounters(databaseName(databaseUrl));
      const statements = statementsBefore === undefined ? undefined : (await statementsRun(databaseName(databaseUrl))) - statementsBefore;
      addDatabaseWork(result, before, after, requests, statements);
    }
    const top = Number(process.env.BENCH_TOP_STATEMENTS ?? 0);
    if (counting && top > 0) console.error(await topStatements(databaseName(databaseUrl), top));
  });
}

/** The statements that took the most execution time on the database (BENCH_TOP_STATEMENTS), one line each. */
async function topStatements(name: string, limit: number): Promise<string> {
  return withAdmin(async (client) => {
    const { rows } = await client.query<{ calls: string; total: number; mean: number; plans: string; plan: number; query: string }>(
      `SELECT s.calls, s.total_exec_time AS total, s.mean_exec_time AS mean, s.plans, s.mean_plan_time AS plan, s.query
         FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
        WHERE d.datname = $1 ORDER BY s.total_exec_time DESC LIMIT $2`,
      [name, limit],
    );
    const all = rows.reduce((sum, row) => sum + row.total, 0);
    const lines = rows.map((row) => {
      const text = row.query.replace(/\s+/g, ' ').slice(0, 110);
      return `  ${row.total.toFixed(0).padStart(8)} ms ${((100 * row.total) / all).toFixed(1).padStart(5)} %  ${String(row.calls).padStart(8)} calls  mean ${row.mean.toFixed(3)} ms  ${String(row.plans).padStart(6)} plans  mean ${Number(row.plan ?? 0).toFixed(3)} ms  ${text}`;
    });
    return [`top statements by execution time on ${name} (the whole run; % of these ${rows.length}):`, ...lines].join('\n');
  });
}


type TargetPlan = { result: TargetResult; run: () => Promise<void> };

/** Every (target, topology, queue) to measure, in the order they run in each round. */
function plan(): TargetPlan[] {
  const plans: TargetPlan[] = [];
  for (const mode of modes) {
    // The blocking mode's ids are those from before the streaming mode existed.
    const suffix = mode === 'blocking' ? '' : `-${mode}`;
    const make = (id: string, kind: TargetKind, target: string, topology: string, queue: QueueKind | null): TargetResult => ({
      id: `${id}${suffix}`,
      kind,
      mode,
      target,
      topology,
      queue,
      measurements: [],
      startups: [],
      notes: [],
    });
    if (targetKinds.includes('sdk-memory')) {
      const result = make('sdk-memory', 'sdk-memory', 'SDK in-memory', '1 process', null);
      plans.push({ result, run: () => benchSdkMemory(result) });
    }
    // Streaming is compared with the in-memory server only (the header says why).
    if (targetKinds.includes('sdk-postgres') && mode === 'blocking') {
      const result = make('sdk-postgres', 'sdk-postgres', 'SDK Postgres', '1 process', null);
      plans.push({ result, run: () => benchSdkPostgres(result) });
    }
    if (targetKinds.includes('keel')) {
      for (const queue of keelQueues) {
        for (const topology of topologies) {
          for (const tracing of tracingModes) {
            const suffix = { off: '', sdk: '-otel', 'sdk-sampled': '-otel-sampled' }[tracing];
            const label = { off: 'Keel', sdk: 'Keel+OTel', 'sdk-sampled': `Keel+OTel ${tracingRatio}` }[tracing];
            const result = make(`keel-${topology}-${queue}${suffix}`, 'keel', label, topology, queue);
            result.tracing = tracing;
            plans.push({ result, run: () => benchKeel(result, topology, queue, tracing) });
          }
        }
      }
    }
  }
  return plans;
}

function rowLabel(result: TargetResult): string {
  const traced = { off: '', sdk: ', OTel SDK', 'sdk-sampled': `, OTel SDK sampling ${tracingRatio}` }[result.tracing ?? 'off'];
  const label = result.kind === 'keel' ? `Keel ${result.topology} (${result.queue} queue${traced})` : result.target;
  return result.mode === 'blocking' ? label : `${label}, ${result.mode}`;
}

// ---------------------------------------------------------------------------------------------
// Report.

type PostgresInfo = { kind: 'private' | 'machine'; transport: 'socket' | 'tcp'; version: string; maxConnections: number; settings: string[] };

function postgresLine(info: PostgresInfo): string {
  return info.kind === 'private'
    ? `Postgres: a private cluster for this run (max_connections ${info.maxConnections}; from the machine's server: ${info.settings.join(', ') || 'no settings copied'}); the servers reach it ${info.transport === 'socket' ? 'through its Unix socket' : acrossHosts ? 'over TCP from the test hosts' : 'over loopback TCP'}`
    : `Postgres: the machine's server at ${new URL(ADMIN_URL).host} (max_connections ${info.maxConnections}), shared with whatever else runs on it, over loopback TCP`;
}


type Summary = {
  tasksPerSecond: number;
  min: number;
  max: number;
  p50: number;
  p99: number;
  /** Streaming: the medians over the rounds of the time to the first event. */
  firstEventP50?: number;
  firstEventP99?: number;
  errors: number;
  rounds: number;
  commitsPerRequest?: number;
  statementsPerRequest?: number;
  peakBackends?: number;
  peakInFlight: number;
  peakQueued: number;
  peakConnections: number;
  /** BENCH_CPU: per group, the total and the cores busy, each the median over the rounds. */
  cpu?: CpuPerTask;
};

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
  const commits = runs.flatMap((m) => (m.commitsPerRequest === undefined ? [] : [m.commitsPerRequest]));
  const statements = runs.flatMap((m) => (m.statementsPerRequest === undefined ? [] : [m.statementsPerRequest]));
  const backends = runs.flatMap((m) => (m.peakBackends === undefined ? [] : [m.peakBackends]));
  const cpuRuns = runs.flatMap((m) => (m.cpu ? [cpuPerTask(m.cpu)] : []));
  const firstEvents = runs.flatMap((m) => (m.firstEventP50 === undefined ? [] : [{ p50: m.firstEventP50, p99: m.firstEventP99! }]));
  let cpu: CpuPerTask | undefined;
  if (cpuRuns.length > 0) {
    const names = [...new Set(cpuRuns.flatMap((run) => Object.keys(run.msPerTask)))].sort((a, b) => cpuGroupRank(a) - cpuGroupRank(b));
    cpu = {
      msPerTask: Object.fromEntries(names.map((name) => [name, median(cpuRuns.flatMap((run) => (name in run.msPerTask ? [run.msPerTask[name]!] : [])))])),
      total: median(cpuRuns.map((run) => run.total)),
      coresBusy: median(cpuRuns.map((run) => run.coresBusy)),
    };
  }
  return {
    tasksPerSecond: median(rates),
    min: Math.min(...rates),
    max: Math.max(...rates),
    p50: median(runs.map((m) => m.p50)),
    p99: median(runs.map((m) => m.p99)),
    ...(firstEvents.length > 0 ? { firstEventP50: median(firstEvents.map((item) => item.p50)), firstEventP99: median(firstEvents.map((item) => item.p99)) } : {}),
    errors: runs.reduce((sum, m) => sum + m.errors, 0),
    rounds: runs.length,
    ...(commits.length > 0 ? { commitsPerRequest: median(commits) } : {}),
    ...(statements.length > 0 ? { statementsPerRequest: median(statements) } : {}),
    ...(backends.length > 0 ? { peakBackends: Math.max(...backends) } : {}),
    peakInFlight: Math.max(...runs.map((m) => m.peakInFlight)),
    peakQueued: Math.max(...runs.map((m) => m.peakQueued)),
    peakConnections: Math.min(...runs.map((m) => m.peakConnections)),
    ...(cpu ? { cpu } : {}),
  };
}

type Row = {
  target: string;
  kind: TargetKind;
  topology: string;
  queue: QueueKind | null;
  concurrency: number;
  summary: Summary | undefined;
  unavailable?: string;
  /** Keel only: its tasks/s ÷ the SDK's at the same concurrency, in the same run. */
  ratioSdkPostgres?: number;
  ratioSdkMemory?: number;
  /** Keel only, with rounds: the same ratios within each round, where both were measured minutes apart. */
  roundRatiosSdkPostgres?: number[];
  roundRatiosSdkMemory?: number[];
  /** Keel, streaming: its first-event p50 ÷ the SDK in-memory server's (lower is better). */
  firstEventRatioSdkMemory?: number;
};

function rows(results: TargetResult[]): Row[] {
  const sdkRate = (kind: TargetKind, concurrency: number) => summarize(results.find((result) => result.kind === kind), concurrency)?.tasksPerSecond;
  const ratio = (value: number, base: number | undefined) => (base === undefined || base <= 0 ? undefined : value / base);
  // Round by round: the machine drifts over a run of several rounds, and a round's targets are
  // measured close together, so each round's ratio leaves the drift out (the medians' ratio does not).
  const roundRatios = (keel: TargetResult, kind: TargetKind, concurrency: number) => {
    const sdk = results.find((result) => result.kind === kind);
    return keel.measurements.flatMap((m) => {
      const base = sdk?.measurements.find((other) => other.concurrency === concurrency && other.round === m.round);
      return m.concurrency === concurrency && base && base.tasksPerSecond > 0 ? [m.tasksPerSecond / base.tasksPerSecond] : [];
    });
  };
  return concurrencies.flatMap((concurrency) =>
    results.map((result) => {
      const summary = summarize(result, concurrency);
      const row: Row = { target: result.target, kind: result.kind, topology: result.topology, queue: result.queue, concurrency, summary };
      if (!summary && result.unavailable) row.unavailable = firstLine(result.unavailable);
      if (summary && result.kind === 'keel') {
        const onPostgres = ratio(summary.tasksPerSecond, sdkRate('sdk-postgres', concurrency));
        const inMemory = ratio(summary.tasksPerSecond, sdkRate('sdk-memory', concurrency));
        if (onPostgres !== undefined) row.ratioSdkPostgres = onPostgres;
        if (inMemory !== undefined) row.ratioSdkMemory = inMemory;
        const sdkFirstEvent = summarize(results.find((other) => other.kind === 'sdk-memory'), concurrency)?.firstEventP50;
        if (summary.firstEventP50 !== undefined && !Number.isNaN(summary.firstEventP50)) {
          const firstEvent = ratio(summary.firstEventP50, sdkFirstEvent);
          if (firstEvent !== undefined) row.firstEventRatioSdkMemory = firstEvent;
        }
        if (rounds > 1) {
          row.roundRatiosSdkPostgres = roundRatios(result, 'sdk-postgres', concurrency);
          row.roundRatiosSdkMemory = roundRatios(result, 'sdk-memory', concurrency);
        }
      }
      return row;
    }),
  );
}

/**
 * A plain text table: the first `leftColumns` columns left-aligned, the rest right-aligned. A row
 * shorter than the header (a note in place of figures) has its last cell printed as it is.
 */
function table(header: string[], body: string[][], leftColumns: number): string[] {
  const full = [header, ...body.filter((cells) => cells.length === header.length)];
  const widths = header.map((_, column) => Math.max(...full.map((cells) => cells[column]!.length)));
  const line = (cells: string[]) => {
    const short = cells.length < header.length;
    return cells
      .map((cell, column) => {
        if (short && column === cells.length - 1) return cell;
        return column < leftColumns ? cell.padEnd(widths[column]!) : cell.padStart(widths[column]!);
      })
      .join('  ')
      .trimEnd();
  };
  return [line(header), ...body.map((cells) => (cells.length === 0 ? '' : line(cells)))];
}

/**
 * A mode's table, a row per target and concurrency: who, then the mode's `columns`, then the
 * statements and commits per request, the CPU per task (BENCH_CPU) and the tasks/s range (rounds).
 */
function resultTable(all: Row[], columns: string[], cellsOf: (row: Row, summary: Summary) => string[]): string[] {
  const header = ['conc', 'target', 'topology', 'queue', ...columns, 'stmts/req', 'commits/req'];
  if (cpuEnabled) header.push('CPU ms/task');
  if (rounds > 1) header.push('range');
  const body: string[][] = [];
  for (const concurrency of concurrencies) {
    if (body.length > 0) body.push([]);
    for (const row of all.filter((item) => item.concurrency === concurrency)) {
      const m = row.summary;
      const lead = [String(concurrency), row.target, row.topology, row.queue ?? '-'];
      if (!m) {
        body.push([...lead, `not available${row.unavailable ? `: ${row.unavailable}` : ''}`]);
        continue;
      }
      const cells = [
        ...lead,
        ...cellsOf(row, m),
        m.statementsPerRequest === undefined ? '-' : fmt(m.statementsPerRequest, 2),
        m.commitsPerRequest === undefined ? '-' : fmt(m.commitsPerRequest, 2),
      ];
      if (cpuEnabled) cells.push(m.cpu ? ms(m.cpu.total, 2) : '-');
      if (rounds > 1) cells.push(`${fmt(m.min)}–${fmt(m.max)}`);
      body.push(cells);
    }
  }
  return table(header, body, 4);
}

const ratioCell = (value: number | undefined) => (value === undefined ? '-' : `${fmt(value, 2)}×`);

/** The run's description under a section's title: machine, Postgres, load, what counts as a success, Keel's topologies. */
function runLines(results: TargetResult[], postgres: PostgresInfo, success: string): string[] {
  const lines: string[] = [];
  const anyKeel = results.some((result) => result.kind === 'keel');
  lines.push(machineLine(postgres.version));
  lines.push(postgresLine(postgres));
  lines.push(
    `load: ${serverWarmupSeconds > 0 ? `${serverWarmupSeconds} s of server warm-up at concurrency ${SERVER_WARMUP_CONCURRENCY} per target, then ` : ''}${warmupSeconds} s warm-up (longer until every client has had its first answer) + ${seconds} s measured per target and concurrency${rounds > 1 ? `, ${rounds} rounds (figures are medians; range = tasks/s min–max)` : ''}; ` +
      `one target at a time, each in processes of its own; load generator, servers, Postgres${keelQueues.includes('redis') ? ' and Redis' : ''} share the machine; ` +
      `SDK pg pool: ${sdkPoolSize}${anyKeel ? `; Keel auth: ${keelAuthMode}` : ''}`,
  );
  lines.push(success);
  if (anyKeel) {
    lines.push(`Keel topologies: ${topologies.map((topology) => `${topology} = ${TOPOLOGY_DESCRIPTION[topology]}`).join('; ')}${topologies.includes('split') ? ' (clients round-robin over the APIs)' : ''}`);
  }
  return lines;
}

function blockingSection(results: TargetResult[], postgres: PostgresInfo): string[] {
  const lines: string[] = [];
  lines.push('');
  lines.push('bench:a2a — blocking SendMessage over JSON-RPC, echo agent, a new task per request');
  lines.push(...runLines(results, postgres, 'success = a COMPLETED task carrying the expected artifact text; latency percentiles over successes; errors summed over rounds'));
  lines.push('');

  const all = rows(results);
  lines.push(
    ...resultTable(all, ['tasks/s', 'p50 ms', 'p99 ms', 'errors', '÷SDK-PG', '÷SDK-mem'], (row, m) => [
      fmt(m.tasksPerSecond),
      ms(m.p50),
      ms(m.p99),
      String(m.errors),
      ratioCell(row.ratioSdkPostgres),
      ratioCell(row.ratioSdkMemory),
    ]),
  );
  lines.push('');
  lines.push('÷SDK-PG, ÷SDK-mem: Keel tasks/s ÷ the SDK server on Postgres / in memory at the same concurrency in this run (targets, docs/performance.md: ≥ 3× and ≥ 0.5×)');
  const perRound = all.filter((row) => (row.roundRatiosSdkMemory?.length ?? 0) + (row.roundRatiosSdkPostgres?.length ?? 0) > 0);
  if (perRound.length > 0) {
    lines.push('  the same ratios round by round (each round measures every target once, in rotation), then their median:');
    const roundText = (name: string, ratios: number[] | undefined) =>
      ratios && ratios.length > 0 ? `${name} ${ratios.map((value) => `${fmt(value, 2)}×`).join(', ')} (median ${fmt(median(ratios), 2)}×)` : null;
    for (const row of perRound) {
      const parts = [roundText('÷SDK-PG', row.roundRatiosSdkPostgres), roundText('÷SDK-mem', row.roundRatiosSdkMemory)].filter((part) => part !== null);
      lines.push(`  ${row.concurrency}  ${row.target} ${row.topology}${row.queue ? ` (${row.queue} queue)` : ''}: ${parts.join('; ')}`);
    }
  }
  if (settleSeconds > 0) {
    lines.push('commits/req: pg_stat_database.xact_commit of the bench database over the whole phase at that concurrency (warm-up, window, drain,');
    lines.push(`  ${settleSeconds} s idle until every backend has reported) ÷ the requests sent in it; every committed transaction: reads, queue polling, sweeps too`);
    lines.push('stmts/req: the statements the server ran over the same phase ÷ the same requests: Keel\'s top-level statements as pg_stat_statements counts them');
    lines.push('  (BEGIN, COMMIT, queue polling and sweeps too; tracked in Keel\'s database only), the SDK store\'s from its own counter');
  }
  lines.push(...cpuLines(all));
  lines.push(...tracingLines(tracingCosts(results)));
  return lines;
}

type TracingCost = {
  topology: string;
  queue: QueueKind | null;
  concurrency: number;
  /** Tasks/s with the SDK ÷ without, of the medians; and round by round. */
  ratio: number;
  roundRatios: number[];
  /** The traced mode against Keel without the SDK. */
  tracing: Exclude<Tracing, 'off'>;
  off: Summary;
  sdk: Summary;
};

/** BENCH_TRACING=off,sdk (or sdk-sampled): each Keel target with the SDK against the same target without it, in this run. */
function tracingCosts(results: TargetResult[]): TracingCost[] {
  const costs: TracingCost[] = [];
  const isTraced = (result: TargetResult): result is TargetResult & { tracing: Exclude<Tracing, 'off'> } => result.kind === 'keel' && (result.tracing ?? 'off') !== 'off';
  for (const traced of results.filter(isTraced)) {
    const plain = results.find((result) => result.kind === 'keel' && result.mode === traced.mode && (result.tracing ?? 'off') === 'off' && result.topology === traced.topology && result.queue === traced.queue);
    if (!plain) continue;
    for (const concurrency of concurrencies) {
      const sdk = summarize(traced, concurrency);
      const off = summarize(plain, concurrency);
      if (!sdk || !off || off.tasksPerSecond <= 0) continue;
      const roundRatios = traced.measurements.flatMap((m) => {
        const base = plain.measurements.find((other) => other.concurrency === concurrency && other.round === m.round);
        return m.concurrency === concurrency && base && base.tasksPerSecond > 0 ? [m.tasksPerSecond / base.tasksPerSecond] : [];
      });
      costs.push({ topology: traced.topology, queue: traced.queue, concurrency, tracing: traced.tracing, ratio: sdk.tasksPerSecond / off.tasksPerSecond, roundRatios, off, sdk });
    }
  }
  return costs;
}

function tracingLines(costs: TracingCost[]): string[] {
  if (costs.length === 0) return [];
  const lines = [
    `tracing cost (BENCH_TRACING=${tracingModes.join(',')}): Keel with the OpenTelemetry SDK (BatchSpanProcessor, OTLP/HTTP protobuf to a local sink that discards; ` +
      `${tracingModes.includes('sdk-sampled') ? `sdk: every trace recorded, sdk-sampled: a share of ${tracingRatio} of the traces` : 'every trace recorded'}) ÷ Keel without it, same run:`,
  ];
  for (const cost of costs) {
    const rounds = cost.roundRatios.length > 1 ? `; round by round ${cost.roundRatios.map((value) => `${fmt(value, 2)}×`).join(', ')} (median ${fmt(median(cost.roundRatios), 2)}×)` : '';
    lines.push(
      `  ${cost.concurrency}  ${cost.topology}${cost.queue ? ` (${cost.queue} queue)` : ''}, ${cost.tracing === 'sdk' ? 'every trace' : `sampling ${tracingRatio}`}: ${fmt(cost.sdk.tasksPerSecond)} ÷ ${fmt(cost.off.tasksPerSecond)} tasks/s = ${fmt(cost.ratio, 2)}× ` +
        `(${fmt((cost.ratio - 1) * 100, 1)} %); p50 ${ms(cost.sdk.p50)} against ${ms(cost.off.p50)} ms, p99 ${ms(cost.sdk.p99)} against ${ms(cost.off.p99)} ms${rounds}`,
    );
  }
  return lines;
}

/** BENCH_CPU: each row's CPU per task, by process group. */
function cpuLines(all: Row[]): string[] {
  const lines: string[] = [];
  const withCpu = all.filter((row) => row.summary?.cpu);
  if (withCpu.length > 0) {
    lines.push('');
    lines.push(
      `CPU ms/task: CPU time (utime+stime, /proc) over the measured window ÷ the tasks completed in it${rounds > 1 ? ', medians over the rounds' : ''}; per process group: ` +
        'servers summed per role, postgres = the bench database\'s backends, postgres bg = the private cluster\'s own processes,',
    );
    lines.push('  redis = the whole redis-server (shared with anything else using it), load generator = this process');
    const labels = withCpu.map((row) => `${row.concurrency}  ${row.target} ${row.topology}${row.queue ? ` (${row.queue} queue)` : ''}`);
    const width = Math.max(...labels.map((label) => label.length));
    withCpu.forEach((row, index) => lines.push(`  ${labels[index]!.padEnd(width)}  ${cpuText(row.summary!.cpu!)}`));
  }
  return lines;
}

/** The streaming mode's table: streams completed a second, time to the first event and to the end, Keel ÷ the SDK in-memory server. */
function streamingSection(results: TargetResult[], postgres: PostgresInfo, alone: boolean): string[] {
  const lines: string[] = [];
  lines.push('');
  lines.push('bench:a2a — streaming: SendStreamingMessage over JSON-RPC through the official @a2a-js/sdk client (sendMessageStream), echo agent, a new task per stream');
  const success = 'success = a stream whose last state is COMPLETED and that carried the expected artifact text; first event = sending to the first event read; end = to the stream\'s end; percentiles over successes';
  if (alone) lines.push(...runLines(results, postgres, success));
  else lines.push(success);
  lines.push('');
  const all = rows(results);
  lines.push(
    ...resultTable(all, ['tasks/s', 'first p50 ms', 'first p99 ms', 'end p50 ms', 'end p99 ms', 'errors', '÷SDK-mem', 'first p50 ÷SDK-mem'], (row, m) => [
      fmt(m.tasksPerSecond),
      ms(m.firstEventP50 ?? Number.NaN),
      ms(m.firstEventP99 ?? Number.NaN),
      ms(m.p50),
      ms(m.p99),
      String(m.errors),
      ratioCell(row.ratioSdkMemory),
      ratioCell(row.firstEventRatioSdkMemory),
    ]),
  );
  lines.push('');
  lines.push('÷SDK-mem: Keel streams completed a second ÷ the SDK in-memory server\'s at the same concurrency in this run; first p50 ÷SDK-mem: Keel\'s time to the first event ÷ the SDK\'s (lower is better)');
  const perRound = all.filter((row) => (row.roundRatiosSdkMemory?.length ?? 0) > 0);
  if (perRound.length > 0) {
    lines.push('  ÷SDK-mem round by round (each round measures every target once, in rotation), then its median:');
    for (const row of perRound) {
      const ratios = row.roundRatiosSdkMemory!;
      lines.push(`  ${row.concurrency}  ${row.target} ${row.topology}${row.queue ? ` (${row.queue} queue)` : ''}: ${ratios.map((value) => `${fmt(value, 2)}×`).join(', ')} (median ${fmt(median(ratios), 2)}×)`);
    }
  }
  lines.push(...cpuLines(all));
  return lines;
}

function report(results: TargetResult[], postgres: PostgresInfo): void {
  const lines: string[] = [];
  const blocking = results.filter((result) => result.mode === 'blocking');
  const streaming = results.filter((result) => result.mode === 'streaming');
  if (blocking.length > 0) lines.push(...blockingSection(blocking, postgres));
  if (streaming.length > 0) lines.push(...streamingSection(streaming, postgres, blocking.length === 0));
  // Each mode's rows compare with that mode's SDK figures only.
  const all = [...rows(blocking), ...rows(streaming)];

  // Each client has a connection of its own: fewer connections than clients, or a request queued for
  // one, means the load generator (not the server) held requests back.
  const measured = all.filter((row) => row.summary);
  const starved = measured.filter((row) => row.summary!.peakQueued > 0 || row.summary!.peakConnections < row.concurrency);
  if (measured.length > 0) lines.push('');
  if (measured.length > 0 && starved.length === 0) {
    const inFlight = concurrencies
      .filter((c) => measured.some((row) => row.concurrency === c))
      .map((c) => `at ${c}: ≤ ${Math.max(...measured.filter((row) => row.concurrency === c).map((row) => row.summary!.peakInFlight))} in flight`);
    lines.push(`client side: every run had one connection per client and no request queued for a connection (${inFlight.join(', ')})`);
  } else if (starved.length > 0) {
    lines.push('client side: the load generator held requests back (undici pool statistics, sampled every 250 ms)');
    for (const row of starved) {
      const m = row.summary!;
      lines.push(`  ${row.target} ${row.topology} ${row.queue ?? ''} at ${row.concurrency}: ≤ ${m.peakConnections} connections, ≤ ${m.peakInFlight} in flight, ≤ ${m.peakQueued} queued for a connection`);
    }
  }

  const withErrors = results.flatMap((result) => result.measurements.filter((m) => m.errors > 0).map((m) => ({ result, m })));
  if (withErrors.length > 0) {
    lines.push('');
    lines.push('errors');
    for (const { result, m } of withErrors) {
      const kinds = Object.entries(m.errorKinds).sort((a, b) => b[1] - a[1]);
      lines.push(`  ${rowLabel(result)}, concurrency ${m.concurrency}${rounds > 1 ? `, round ${m.round}` : ''}:`);
      for (const [kind, count] of kinds.slice(0, 8)) lines.push(`    ${String(count).padStart(7)} × ${kind}`);
      if (kinds.length > 8) lines.push(`    ... and ${kinds.length - 8} other kinds`);
    }
  }

  // The table shows the first line; a longer reason (a child's last output) comes here in full.
  const unavailable = results.filter((result) => result.unavailable?.includes('\n'));
  if (unavailable.length > 0) {
    lines.push('');
    for (const result of unavailable) lines.push(`${rowLabel(result)} not available: ${result.unavailable}`);
  }
  const notes = results.filter((result) => result.notes.length > 0);
  if (notes.length > 0) {
    lines.push('');
    for (const result of notes) for (const note of result.notes) lines.push(`${rowLabel(result)}: ${note}`);
  }

  const work = results.filter((result) => result.databaseWork && result.databaseWork.requests > 0);
  if (work.length > 0) {
    lines.push('');
    lines.push('database work per request over the whole run of each target, start-up to shut-down (every concurrency, warm-ups, idle waits and the servers\' own');
    lines.push('shut-down included; counters read after the servers exited). Commits here include the notification reads of LISTEN sessions (Keel\'s journal');
    lines.push('listener, the Postgres queue\'s workers): Postgres reads each wake-up\'s notifications in a transaction of its own and reports a listening');
    lines.push('session\'s counts only when it ends, so the per-phase commits/req above leave them out and these take them all in');
    for (const result of work) {
      const w = result.databaseWork!;
      const per = (value: number) => fmt(value / w.requests, 2);
      const statements = w.statements === undefined ? '' : `${per(w.statements)} statements, `;
      const peak = Math.max(0, ...result.measurements.map((m) => m.peakBackends ?? 0));
      lines.push(
        `  ${rowLabel(result).padEnd(32)} ${statements}${per(w.commits)} commits, ${per(w.rollbacks)} rollbacks, ${per(w.rowsWritten)} rows written (${w.requests} requests; ≤ ${peak} connections)`,
      );
    }
  }

  const started = results.filter((result) => result.startups.length > 0);
  if (started.length > 0) {
    lines.push('');
    lines.push(`Keel start-up (spawn to /readyz answering 200, all processes at once, after \`keel migrate\`${keelAuthMode === 'token' ? ' and `keel clients add`' : ''})`);
    for (const result of started) {
      const text = result.startups.map((processes) => processes.map((item) => `${item.role} ${fmt(item.readyMs / 1000)} s`).join(', ')).join(' | ');
      lines.push(`  ${rowLabel(result).padEnd(32)} ${text}`);
    }
  }
  console.log(lines.join('\n'));
}

function ms(value: number, digits = 1): string {
  return Number.isNaN(value) ? '-' : fmt(value, digits);
}

function firstLine(text: string): string {
  return text.split('\n')[0]!;
}

/** Every figure, for docs: the summary rows and the raw measurements. */
function jsonDocument(results: TargetResult[], postgres: PostgresInfo): Record<string, unknown> {
  const round2 = (value: number | undefined) => (value === undefined || Number.isNaN(value) ? null : Math.round(value * 100) / 100);
  const round3 = (value: number | undefined) => (value === undefined || Number.isNaN(value) ? null : Math.round(value * 1000) / 1000);
  const rowJson = (row: Row) => ({
    target: row.target,
    topology: row.topology,
    queue: row.queue,
    concurrency: row.concurrency,
    ...(row.summary
      ? {
          tasksPerSecond: round2(row.summary.tasksPerSecond),
          p50Ms: round2(row.summary.p50),
          p99Ms: round2(row.summary.p99),
          ...(row.summary.firstEventP50 !== undefined ? { firstEventP50Ms: round2(row.summary.firstEventP50), firstEventP99Ms: round2(row.summary.firstEventP99) } : {}),
          errors: row.summary.errors,
          rounds: row.summary.rounds,
          ...(rounds > 1 ? { tasksPerSecondMin: round2(row.summary.min), tasksPerSecondMax: round2(row.summary.max) } : {}),
          ratioSdkPostgres: round2(row.ratioSdkPostgres),
          ratioSdkMemory: round2(row.ratioSdkMemory),
          ...(row.firstEventRatioSdkMemory !== undefined ? { firstEventRatioSdkMemory: round2(row.firstEventRatioSdkMemory) } : {}),
          ...(row.roundRatiosSdkMemory ? { roundRatiosSdkPostgres: row.roundRatiosSdkPostgres!.map(round2), roundRatiosSdkMemory: row.roundRatiosSdkMemory.map(round2) } : {}),
          statementsPerRequest: round2(row.summary.statementsPerRequest),
          commitsPerRequest: round2(row.summary.commitsPerRequest),
          ...(row.summary.cpu
            ? {
                cpuMsPerTask: Object.fromEntries(Object.entries(row.summary.cpu.msPerTask).map(([name, value]) => [name, round3(value)])),
                cpuMsPerTaskTotal: round3(row.summary.cpu.total),
                cpuCoresBusy: round2(row.summary.cpu.coresBusy),
              }
            : {}),
          peakDatabaseConnections: row.summary.peakBackends ?? null,
          peakInFlight: row.summary.peakInFlight,
          peakQueuedClientSide: row.summary.peakQueued,
          clientConnections: row.summary.peakConnections,
        }
      : { unavailable: row.unavailable ?? 'not measured' }),
  });
  return {
    bench: 'a2a',
    date: new Date().toISOString(),
    machine: { cores: cpus().length, cpu: cpus()[0]?.model.trim(), memoryGiB: round2(totalmem() / 2 ** 30), node: process.version, postgres: postgres.version },
    postgres,
    load: {
      serverWarmupSeconds,
      serverWarmupConcurrency: SERVER_WARMUP_CONCURRENCY,
      warmupSeconds,
      seconds,
      rounds,
      concurrencies,
      topologies,
      keelQueues,
      keelAuth: keelAuthMode,
      sdkPoolSize,
      cpu: cpuEnabled,
      ...(modes.includes('streaming') ? { modes } : {}),
      ...(tracingModes.some((tracing) => tracing !== 'off') ? { tracing: tracingModes, ...(tracingModes.includes('sdk-sampled') ? { tracingRatio } : {}) } : {}),
      ...(keelNodeArgs.length > 0 ? { keelNodeArgs } : {}),
      ...(logStatements ? { logStatements } : {}),
    },
    rows: rows(results.filter((result) => result.mode === 'blocking')).map(rowJson),
    ...(tracingModes.length > 1
      ? {
          tracingCost: tracingCosts(results.filter((result) => result.mode === 'blocking')).map((cost) => ({
            topology: cost.topology,
            queue: cost.queue,
            concurrency: cost.concurrency,
            tracing: cost.tracing,
            ratio: round3(cost.ratio),
            roundRatios: cost.roundRatios.map(round3),
            tasksPerSecond: { off: round2(cost.off.tasksPerSecond), sdk: round2(cost.sdk.tasksPerSecond) },
            p50Ms: { off: round2(cost.off.p50), sdk: round2(cost.sdk.p50) },
            p99Ms: { off: round2(cost.off.p99), sdk: round2(cost.sdk.p99) },
          })),
        }
      : {}),
    ...(modes.includes('streaming') ? { streamingRows: rows(results.filter((result) => result.mode === 'streaming')).map(rowJson) } : {}),
    targets: results.map((result) => ({
      id: result.id,
      ...(result.mode !== 'blocking' ? { mode: result.mode } : {}),
      target: result.target,
      topology: result.topology,
      queue: result.queue,
      ...(result.tracing !== undefined && result.tracing !== 'off' ? { tracing: result.tracing } : {}),
      ...(result.unavailable ? { unavailable: result.unavailable } : {}),
      ...(result.notes.length > 0 ? { notes: result.notes } : {}),
      ...(result.databaseWork
        ? {
            databaseWorkPerRequest: {
              requests: result.databaseWork.requests,
              commits: round2(result.databaseWork.commits / result.databaseWork.requests),
              rollbacks: round2(result.databaseWork.rollbacks / result.databaseWork.requests),
              rowsWritten: round2(result.databaseWork.rowsWritten / result.databaseWork.requests),
              ...(result.databaseWork.statements !== undefined ? { statements: round2(result.databaseWork.statements / result.databaseWork.requests) } : {}),
            },
          }
        : {}),
      ...(result.startups.length > 0 ? { startups: result.startups } : {}),
      measurements: result.measurements.map((m) => ({
        ...m,
        p50: round2(m.p50),
        p99: round2(m.p99),
        ...(m.firstEventP50 !== undefined ? { firstEventP50: round2(m.firstEventP50), firstEventP99: round2(m.firstEventP99) } : {}),
        statementsPerRequest: round2(m.statementsPerRequest),
        commitsPerRequest: round2(m.commitsPerRequest),
        ...(m.cpu
          ? {
              cpu: {
                spanMs: round2(m.cpu.spanMs),
                tasks: m.cpu.tasks,
                ms: Object.fromEntries(Object.entries(m.cpu.ms).map(([name, value]) => [name, round2(value)])),
                msPerTask: Object.fromEntries(Object.entries(cpuPerTask(m.cpu).msPerTask).map(([name, value]) => [name, round3(value)])),
              },
            }
          : {}),
      })),
    })),
  };
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  if (acrossHosts) {
    benchHosts = await startBenchHosts(hostLinkMs);
    process.stderr.write(`bench:a2a: the split topology across 4 test hosts on ${benchHosts.cidr}, links delayed ${hostLinkMs} ms each way\n`);
  }
  try {
    return await mainOnHosts();
  } finally {
    await benchHosts?.stop();
    benchHosts = null;
  }
}

async function mainOnHosts(): Promise<number> {
  if (usePrivatePostgres) {
    process.stderr.write('bench:a2a: starting a private Postgres cluster ...');
    // The machine's server is the model (version, settings) when it answers; the cluster starts without it too.
    const mirrorFrom = await withAdmin(async () => ADMIN_URL).catch(() => undefined);
    privatePostgres = await startPrivatePostgres({
      ...(mirrorFrom ? { mirrorFrom } : {}),
      maxConnections: privateMaxConnections,
      ...(process.env.BENCH_PG_BINDIR ? { binDir: process.env.BENCH_PG_BINDIR } : {}),
      signal: interrupted.signal,
      onDataDir: (path) => guard({ kind: 'dir', path }),
      onServer: (pid, dir) => guard({ kind: 'postgres', pid, dir }),
      ...(benchHosts ? { network: { address: benchHosts.address, cidr: benchHosts.cidr } } : {}),
    });
    adminUrl = privatePostgres.adminUrl;
    if (postgresTransport === 'socket' && privatePostgres.socketUrl === null) {
      await privatePostgres.stop();
      process.stderr.write('\n');
      fail(`BENCH_POSTGRES_TRANSPORT=socket: the private cluster's data directory ${privatePostgres.dataDir} is too long a path for a Unix socket; set a shorter TMPDIR, or BENCH_POSTGRES_TRANSPORT=tcp`);
    }
    process.stderr.write(
      ` PostgreSQL ${privatePostgres.version} on ${new URL(adminUrl).host}; the servers connect ${postgresTransport === 'socket' ? `through its Unix socket in ${privatePostgres.dataDir}` : benchHosts ? `over TCP to ${benchHosts.address} from their hosts` : 'over loopback TCP'}\n`,
    );
  }
  try {
    return await measureAll();
  } finally {
    if (privatePostgres) {
      const { pid, dataDir } = privatePostgres;
      await privatePostgres.stop().catch((error: Error) => console.error(`bench:a2a: the private Postgres did not stop cleanly: ${error.message}`));
      privatePostgres = null;
      unguard({ kind: 'postgres', pid, dir: dataDir });
      unguard({ kind: 'dir', path: dataDir });
    }
  }
}

async function measureAll(): Promise<number> {
  const postgres = await withAdmin(async (client): Promise<PostgresInfo> => {
    const version = (await client.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
    const maxConnections = Number((await client.query<{ max_connections: string }>('SHOW max_connections')).rows[0]!.max_connections);
    return { kind: usePrivatePostgres ? 'private' : 'machine', transport: postgresTransport, version, maxConnections, settings: privatePostgres?.settings ?? [] };
  });
  const keelNote = targetKinds.includes('keel') ? `; Keel topologies ${topologies.join(', ')} on queue ${keelQueues.join(', ')}, auth ${keelAuthMode}` : '';
  console.error(
    `bench:a2a: targets ${targetKinds.join(', ')}${modes.includes('streaming') ? `; modes ${modes.join(', ')}` : ''}; concurrency ${concurrencies.join(', ')}; ${serverWarmupSeconds > 0 ? `${serverWarmupSeconds} s server warm-up, then ` : ''}${warmupSeconds} s warm-up + ${seconds} s each` +
      `${rounds > 1 ? `; ${rounds} rounds` : ''}${keelNote}; Postgres ${postgres.kind} (max_connections ${postgres.maxConnections}, ${postgres.transport})`,
  );
  if (postgres.kind === 'machine' && targetKinds.includes('keel') && topologies.includes('split') && keelQueues.includes('postgres') && postgres.maxConnections < 300) {
    console.error(
      `bench:a2a: warning: 4 Keel processes on the Postgres queue backend hold more connections than max_connections ${postgres.maxConnections} allows ` +
        `("too many clients" errors, for other users of the server too); BENCH_POSTGRES=private avoids it`,
    );
  }
  if (logStatements && postgres.kind === 'private') {
    console.error(`bench:a2a: BENCH_LOG_STATEMENTS: the private cluster logs to a pipe of the bench's that keeps only its last lines; for the statements, BENCH_POSTGRES=machine`);
  }
  if (keelNodeArgs.length > 0 && targetKinds.includes('keel')) console.error(`bench:a2a: keel start processes run with node ${keelNodeArgs.join(' ')}`);
  const plans = plan();
  const results = plans.map((item) => item.result);
  for (currentRound = 1; currentRound <= rounds && !interrupted.signal.aborted; currentRound += 1) {
    // Each round starts one target later than the one before: on this machine the targets measured
    // last in a run were measured slowest (2026-12-02: the Keel queue that came fourth fell short of
    // the one that came third, whichever it was), so no target takes the same place in every round.
    const shift = (currentRound - 1) % plans.length;
    for (const { result, run } of [...plans.slice(shift), ...plans.slice(0, shift)]) {
      // A target that could not be measured once is not retried in later rounds.
      if (result.unavailable) continue;
      try {
        await run();
      } catch (error) {
        if (interrupted.signal.aborted) break;
        result.unavailable = (error as Error).message;
        console.error(`  ${rowLabel(result)}: ${result.unavailable}`);
      }
    }
  }
  if (interrupted.signal.aborted) {
    console.error('bench:a2a: interrupted; the servers are stopped and the bench databases dropped');
    return 130;
  }
  report(results, postgres);
  const document = jsonDocument(results, postgres);
  writeBenchJson(document);
  // The last line of stdout: every figure as one JSON document (`npm run bench:a2a | tail -n 1`).
  console.log(JSON.stringify(document));
  return 0;
}

runBench(BENCH, main, interruptOptions);
