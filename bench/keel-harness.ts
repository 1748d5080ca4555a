import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { setMaxListeners } from 'node:events';
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { arch, cpus, platform, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { encodeMasterKey, generateMasterKey } from '../src/sealing/master-key.js';
import { ADMIN_URL, fmt, withBenchDatabase } from './support.js';

// Shared by bench:a2a, bench:lag and bench:memory: child processes in process groups of their own
// (so a Ctrl-C reaches only the bench, which stops the children in order and drops its databases),
// each registered with a clean-up watchdog (bench/cleanup-watchdog.mjs) that removes what a killed
// bench left; Keel started as `node bin/keel.js start` on a fresh bench database, the queue on Redis
// or on Postgres; environment knobs; /proc readings of a child (RSS, descriptors, limits);
// Prometheus text parsing. Nothing here talks to anything but loopback.
//
// Knobs every Keel bench reads (each bench's header lists its own):
//   BENCH_KEEL_QUEUE       Keel's queue backend: redis | postgres (redis); bench:a2a takes a list,
//                          "redis,postgres", and measures each
//   BENCH_REDIS_URL        the Redis of the redis queue (redis://127.0.0.1:6379)
//   BENCH_KEEL_LOG_LEVEL   KEEL_LOG_LEVEL of the Keel children (warn)
//   BENCH_JSON             also write the bench's JSON document (indented) to this file
//   KEEL_BENCH_ADMIN_URL   the machine's Postgres admin URL (bench/support.ts)

export const repoRoot = fileURLToPath(new URL('..', import.meta.url));

// ---------------------------------------------------------------------------------------------
// Environment knobs.

export function envKnobs(bench: string) {
  const fail = (message: string): never => {
    console.error(`${bench}: ${message}`);
    process.exit(2);
  };
  const number = (name: string, fallback: number, check: (value: number) => boolean, expected: string): number => {
    const raw = process.env[name];
    const value = raw === undefined || raw.trim() === '' ? fallback : Number(raw);
    if (!Number.isFinite(value) || !check(value)) fail(`${name}: expected ${expected}, got "${raw}"`);
    return value;
  };
  /** A comma-separated list, each item once. */
  const list = (name: string, fallback: string): string[] => {
    const items = (process.env[name] ?? fallback)
      .split(',')
      .map((item) => item.trim())
      .filter((item) => item !== '');
    if (items.length === 0) fail(`${name}: empty`);
    return [...new Set(items)];
  };
  return {
    fail,
    list,
    positive: (name: string, fallback: number) => number(name, fallback, (value) => value > 0, 'a positive number'),
    nonNegative: (name: string, fallback: number) => number(name, fallback, (value) => value >= 0, 'a number ≥ 0'),
    positiveInt: (name: string, fallback: number) => number(name, fallback, (value) => Number.isInteger(value) && value > 0, 'a positive integer'),
    choice: <T extends string>(name: string, fallback: T, allowed: readonly T[]): T => {
      const value = (process.env[name] ?? fallback).trim() as T;
      if (!allowed.includes(value)) fail(`${name}: expected ${allowed.join(' or ')}, got "${value}"`);
      return value;
    },
    /** A list of allowed values ("redis,postgres"). */
    choices: <T extends string>(name: string, fallback: string, allowed: readonly T[]): T[] =>
      list(name, fallback).map((item) => {
        if (!(allowed as readonly string[]).includes(item)) fail(`${name}: unknown value "${item}" (${allowed.join(', ')})`);
        return item as T;
      }),
    /** 1 or 0 (unset: 0). */
    flag: (name: string): boolean => {
      const value = (process.env[name] ?? '0').trim();
      if (value !== '0' && value !== '1' && value !== '') fail(`${name}: expected 1 or 0`);
      return value === '1';
    },
  };
}

export type QueueBackend = 'redis' | 'postgres';
export const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';

/** The opening of a bench on one Keel installation (bench:lag, bench:memory): its knobs and the queue backend (BENCH_KEEL_QUEUE). */
export function openKeelBench(bench: string) {
  const knobs = envKnobs(bench);
  const queue: QueueBackend = knobs.choice('BENCH_KEEL_QUEUE', 'redis', ['redis', 'postgres'] as const);
  return { knobs, queue };
}

/** BENCH_JSON: the bench's JSON document, indented, to that file. */
export function writeBenchJson(document: unknown): void {
  if (process.env.BENCH_JSON) writeFileSync(process.env.BENCH_JSON, `${JSON.stringify(document, null, 2)}\n`);
}

/**
 * Runs a bench's main (once its knobs are parsed) with the interrupt handlers and the watchdog in
 * place, and exits with its code; the watchdog is dismissed after the bench cleaned up.
 */
export function runBench(bench: string, main: () => Promise<number>, interruptOptions: InterruptOptions = {}): void {
  installInterruptHandlers(bench, interruptOptions);
  main().then(
    async (code) => {
      await dismissWatchdog();
      process.exit(code);
    },
    async (error: Error) => {
      if (interrupted.signal.aborted) console.error(`${bench}: interrupted; the servers are stopped and the bench databases dropped`);
      else console.error(`${bench} failed: ${error.stack ?? error.message}`);
      await dismissWatchdog();
      process.exit(interrupted.signal.aborted ? 130 : 1);
    },
  );
}

// ---------------------------------------------------------------------------------------------
// Interruption: the first SIGINT/SIGTERM aborts `interrupted` (every wait and request listens on
// it; the benches then stop their servers and drop their databases), a later one exits at once,
// killing the children and leaving the rest to the watchdog.

export const interrupted = new AbortController();
setMaxListeners(0, interrupted.signal);
const liveChildren = new Set<ManagedChild>();
const liveDatabases = new Set<string>();

export type InterruptOptions = {
  /** What a forced exit leaves for the operator to remove, when no watchdog will (else the bench databases are named). */
  leftBehind?: () => string | null;
  /** At exit, after the children are killed. */
  onExit?: () => void;
};

function installInterruptHandlers(bench: string, options: InterruptOptions = {}): void {
  startWatchdog();
  let firstSignalAt = 0;
  const onSignal = (signal: NodeJS.Signals) => {
    const now = Date.now();
    if (firstSignalAt === 0) {
      firstSignalAt = now;
      console.error(`\n${bench}: ${signal}, stopping the servers and dropping the bench databases (again to force)`);
      interrupted.abort(new Error(`interrupted by ${signal}`));
      return;
    }
    // One Ctrl-C can arrive twice: from the terminal and relayed by tsx (which re-sends when it has
    // not heard back from this process within 30 ms). Only a later one means "force".
    if (now - firstSignalAt < 500) return;
    // The 'exit' listener kills the children; the watchdog drops the databases and removes the rest.
    if (!watchdogConnected()) {
      const left = options.leftBehind?.() ?? (liveDatabases.size > 0 ? `drop by hand: ${[...liveDatabases].join(', ')}` : null);
      if (left) console.error(`${bench}: left behind, ${left}`);
    }
    process.exit(130);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  process.on('exit', () => {
    for (const child of liveChildren) child.kill('SIGKILL');
    options.onExit?.();
  });
}

// The backstop: a watchdog process that stops and removes whatever the bench started and did not
// clean up itself, should the bench be killed (tsx SIGKILLs a child that does not acknowledge a
// relayed Ctrl-C within about 60 ms, which a busy load generator may not).
export type Guarded =
  | { kind: 'group'; pid: number }
  | { kind: 'postgres'; pid: number; dir: string }
  | { kind: 'database'; name: string; adminUrl: string }
  | { kind: 'dir'; path: string };

let watchdog: ChildProcess | null = null;

function startWatchdog(): void {
  if (watchdog) return;
  try {
    watchdog = spawn(process.execPath, [fileURLToPath(new URL('./cleanup-watchdog.mjs', import.meta.url))], {
      cwd: repoRoot,
      detached: true,
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
    });
    watchdog.on('error', () => undefined);
    watchdog.unref();
    watchdog.channel?.unref();
  } catch {
    watchdog = null;
  }
}

/** Whether the watchdog is there to clean up after a forced exit. */
export function watchdogConnected(): boolean {
  return watchdog?.connected === true;
}

function tellWatchdog(op: 'add' | 'remove', item: Guarded): void {
  if (!watchdog?.connected) return;
  try {
    watchdog.send({ op, ...item }, () => undefined);
  } catch {
    // The watchdog is gone: the clean-up in this process still runs.
  }
}

/** At the end, after the bench cleaned up itself: the watchdog may go. */
async function dismissWatchdog(): Promise<void> {
  const current = watchdog;
  if (!current?.connected) return;
  await new Promise<void>((resolve) => {
    try {
      current.send({ op: 'bye' }, () => resolve());
    } catch {
      resolve();
    }
  });
}

/** Puts something the bench started on the watchdog's list (a no-op without a watchdog). */
export const guard = (item: Guarded) => tellWatchdog('add', item);
/** Takes it off again once the bench removed it itself. */
export const unguard = (item: Guarded) => tellWatchdog('remove', item);

export function throwIfInterrupted(): void {
  if (interrupted.signal.aborted) throw interrupted.signal.reason as Error;
}

export function sleep(ms: number): Promise<void> {
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

// ---------------------------------------------------------------------------------------------
// Child processes.

export type ManagedChildOptions = {
  env?: NodeJS.ProcessEnv;
  /** An IPC channel to the child (the SDK server wants one). */
  ipc?: boolean;
  /** Keep the whole stdout apart (a command whose answer is on stdout): see `stdout`. */
  captureStdout?: boolean;
};

export class ManagedChild {
  readonly process: ChildProcess;
  private readonly output: string[] = [];
  /** The first lines the child printed, kept for good (e.g. the inspector's URL). */
  readonly firstLines: string[] = [];
  /** The whole stdout, under captureStdout. */
  private stdoutText = '';
  readonly exited: Promise<number | null>;
  private hasExited = false;

  constructor(
    readonly name: string,
    command: string,
    args: string[],
    options: ManagedChildOptions = {},
  ) {
    this.process = spawn(command, args, {
      cwd: repoRoot,
      env: options.env ?? process.env,
      detached: true,
      stdio: options.ipc ? ['ignore', 'pipe', 'pipe', 'ipc'] : ['ignore', 'pipe', 'pipe'],
    });
    liveChildren.add(this);
    const pid = this.process.pid;
    if (pid !== undefined) guard({ kind: 'group', pid });
    const keep = (chunk: Buffer) => {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.trim() === '') continue;
        this.output.push(line);
        if (this.output.length > 60) this.output.shift();
        if (this.firstLines.length < 40) this.firstLines.push(line);
      }
    };
    if (options.captureStdout) {
      // Kept apart from the output tail: it may hold a secret (a client token) that error messages must not show.
      this.process.stdout?.on('data', (chunk: Buffer) => (this.stdoutText += chunk.toString('utf8')));
    } else {
      this.process.stdout?.on('data', keep);
    }
    this.process.stderr?.on('data', keep);
    this.exited = new Promise((resolve) => {
      this.process.on('exit', (code, signal) => {
        this.hasExited = true;
        liveChildren.delete(this);
        if (pid !== undefined) unguard({ kind: 'group', pid });
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

  get pid(): number {
    return this.process.pid ?? -1;
  }

  get running(): boolean {
    return !this.hasExited;
  }

  /** The whole stdout, under captureStdout. */
  get stdout(): string {
    return this.stdoutText;
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
  async stop(graceMs = 15_000): Promise<number | null> {
    if (!this.running) return this.exited;
    this.kill('SIGTERM');
    const timer = setTimeout(() => this.kill('SIGKILL'), graceMs);
    const code = await this.exited;
    clearTimeout(timer);
    return code;
  }
}

/** Runs a short command as a managed child (stopped on Ctrl-C like the servers); its stdout, or an error with its output. */
export async function runCommand(name: string, args: string[], env: NodeJS.ProcessEnv, timeoutMs = 120_000): Promise<string> {
  const child = new ManagedChild(name, process.execPath, args, { env, captureStdout: true });
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const onAbort = () => child.kill('SIGTERM');
  interrupted.signal.addEventListener('abort', onAbort, { once: true });
  try {
    const code = await child.exited;
    throwIfInterrupted();
    if (code !== 0) throw new Error(`${name} failed (exit ${code}):\n${child.tail()}`);
    return child.stdout;
  } finally {
    clearTimeout(timer);
    interrupted.signal.removeEventListener('abort', onAbort);
  }
}

export async function freePort(): Promise<number> {
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

/** `count` distinct free ports (each free when asked; a server started right after takes it). */
export async function freePorts(count: number): Promise<number[]> {
  const ports = new Set<number>();
  while (ports.size < count) ports.add(await freePort());
  return [...ports];
}

/** Polls `url` until it answers 200; fails when the child exits first or after `timeoutMs`. */
export async function waitUntilReady(child: ManagedChild, url: string, timeoutMs: number): Promise<void> {
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
// Databases.

export function databaseName(url: string): string {
  return new URL(url).pathname.slice(1);
}

/**
 * A fresh bench database on the server at `adminUrl` for `fn`, dropped afterwards; named on a
 * forced exit and put on the watchdog's list meanwhile.
 */
export async function withTrackedDatabase<T>(fn: (url: string) => Promise<T>, adminUrl: string = ADMIN_URL): Promise<T> {
  let name = '';
  try {
    return await withBenchDatabase(async (url) => {
      name = databaseName(url);
      liveDatabases.add(name);
      guard({ kind: 'database', name, adminUrl });
      return fn(url);
    }, adminUrl);
  } finally {
    // withBenchDatabase has dropped it by now.
    if (name !== '') {
      liveDatabases.delete(name);
      unguard({ kind: 'database', name, adminUrl });
    }
  }
}

export async function withAdmin<T>(fn: (client: pg.Client) => Promise<T>, adminUrl: string = ADMIN_URL): Promise<T> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

// ---------------------------------------------------------------------------------------------
// CPU time of processes on this machine, from /proc (Linux only).

let clockTicksRead: number | undefined;

/** Clock ticks per second of /proc/<pid>/stat (USER_HZ), read once. */
export function clockTicks(): number {
  if (clockTicksRead === undefined) {
    try {
      const value = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
      clockTicksRead = Number.isInteger(value) && value > 0 ? value : 100;
    } catch {
      clockTicksRead = 100;
    }
  }
  return clockTicksRead;
}

/** utime+stime of a process (all its threads) and when it started, both in clock ticks (the latter since boot); null once it is gone. */
export function procStat(pid: number, thread?: number): { ticks: number; startTicks: number } | null {
  try {
    const stat = readFileSync(thread === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${thread}/stat`, 'utf8');
    // The command name (field 2) is in parentheses and may hold spaces: count from after it (field 3 at index 0).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { ticks: Number(fields[11]) + Number(fields[12]), startTicks: Number(fields[19]) };
  } catch {
    return null;
  }
}

export async function postgresVersion(): Promise<string> {
  return withAdmin(async (client) => (await client.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version);
}

export function machineLine(postgres: string): string {
  const cores = cpus();
  const model = cores[0]?.model.trim() ?? 'unknown CPU';
  return `machine: ${cores.length} cores (${model}), ${fmt(totalmem() / 2 ** 30)} GiB, ${platform()} ${arch()}, node ${process.version}, Postgres ${postgres}; ${new Date().toISOString()}`;
}

// ---------------------------------------------------------------------------------------------
// Keel.

export type KeelChild = { child: ManagedChild; origin: string; port: number; dataDir: string };

export type KeelStartOptions = {
  name: string;
  databaseUrl: string;
  queue: QueueBackend;
  /** Shared by every process of one installation. */
  queuePrefix: string;
  masterKey: string;
  /** A config file of the bench's own (else an empty one: everything from the environment). */
  configYaml?: string;
  /** Start Node's inspector on a free loopback port (for forced garbage collections). */
  inspector?: boolean;
  env?: Record<string, string>;
};

export function newInstallation(): { queuePrefix: string; masterKey: string } {
  return { queuePrefix: `bench${randomBytes(4).toString('hex')}`, masterKey: encodeMasterKey(generateMasterKey()) };
}

/** `node bin/keel.js start` (role all) on the given database, auth off, loopback only; resolves once /readyz answers 200. */
export async function startKeelProcess(options: KeelStartOptions): Promise<KeelChild> {
  const dataDir = mkdtempSync(join(tmpdir(), 'keel-bench-'));
  guard({ kind: 'dir', path: dataDir });
  const configFile = join(dataDir, 'keel.config.yaml');
  // A config file of the bench's own, so a keel.config.yaml in the working directory cannot change the run.
  writeFileSync(configFile, options.configYaml ?? '# bench: everything comes from the environment\n');
  const port = await freePort();
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    KEEL_CONFIG: configFile,
    KEEL_DATABASE_URL: options.databaseUrl,
    KEEL_MASTER_KEY: options.masterKey,
    KEEL_SERVER_HOST: '127.0.0.1',
    KEEL_SERVER_PORT: String(port),
    KEEL_DATA_DIR: dataDir,
    KEEL_AUTH_MODE: 'none',
    KEEL_QUEUE_PREFIX: options.queuePrefix,
    KEEL_LOG_LEVEL: process.env.BENCH_KEEL_LOG_LEVEL ?? 'warn',
    // Nothing routes to a bench's Keel: it stops at once, without the readiness delay.
    KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS: '0',
    ...options.env,
  };
  delete env.KEEL_QUEUE_REDIS_URL;
  if (options.queue === 'redis') env.KEEL_QUEUE_REDIS_URL = redisUrl;
  if (options.inspector) env.NODE_OPTIONS = `${env.NODE_OPTIONS ?? ''} --inspect=127.0.0.1:0`.trim();
  const origin = `http://127.0.0.1:${port}`;
  const child = new ManagedChild(options.name, process.execPath, [join(repoRoot, 'bin/keel.js'), 'start'], { env });
  try {
    await waitUntilReady(child, `${origin}/readyz`, 90_000);
  } catch (error) {
    await child.stop();
    removeDataDir(dataDir);
    throw error;
  }
  return { child, origin, port, dataDir };
}

/** The inspector's WebSocket URL a child printed (`Debugger listening on ws://...`), if any. */
export function inspectorUrl(child: ManagedChild): string | null {
  for (const line of child.firstLines) {
    const match = /Debugger listening on (ws:\/\/127\.0\.0\.1:\d+\/\S+)/.exec(line);
    if (match) return match[1]!;
  }
  return null;
}

/** A full garbage collection in the child, through the inspector protocol (HeapProfiler.collectGarbage). */
export async function collectGarbage(url: string): Promise<void> {
  const { WebSocket } = await import('undici');
  const socket = new WebSocket(url);
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the inspector did not answer within 30 s')), 30_000);
      socket.addEventListener('error', () => {
        clearTimeout(timer);
        reject(new Error(`inspector connection to ${url} failed`));
      });
      socket.addEventListener('open', () => socket.send(JSON.stringify({ id: 1, method: 'HeapProfiler.collectGarbage' })));
      socket.addEventListener('message', (event) => {
        const message = JSON.parse(String(event.data)) as { id?: number; error?: { message?: string } };
        if (message.id !== 1) return;
        clearTimeout(timer);
        if (message.error) reject(new Error(`HeapProfiler.collectGarbage: ${message.error.message}`));
        else resolve();
      });
    });
  } finally {
    socket.close();
  }
}

export async function stopKeelProcess(keel: KeelChild): Promise<number | null> {
  const code = await keel.child.stop(20_000);
  removeDataDir(keel.dataDir);
  return code;
}

function removeDataDir(path: string): void {
  rmSync(path, { recursive: true, force: true });
  unguard({ kind: 'dir', path });
}

/** Best effort: the bench's queue keys out of the shared Redis. */
export async function dropRedisKeys(prefix: string): Promise<void> {
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

// ---------------------------------------------------------------------------------------------
// A2A over JSON-RPC.

export const A2A_HEADERS = { 'content-type': 'application/json', 'a2a-version': '1.0' };

export function rpcBody(id: number, method: string, params: unknown): string {
  return JSON.stringify({ jsonrpc: '2.0', id, method, params });
}

export function sendMessageParams(text: string, configuration?: Record<string, unknown>): Record<string, unknown> {
  return { message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text }] }, ...(configuration ? { configuration } : {}) };
}

type JsonRpcAnswer = {
  result?: { task?: { id?: string; status?: { state?: string }; artifacts?: { parts?: { text?: string }[] }[] } };
  error?: { code?: number; message?: string };
};

/**
 * Judges a SendMessage answer: `expectState` COMPLETED also wants the echo artifact `echo: <text>`.
 * Returns the task id, or what went wrong.
 */
export function judgeSend(statusCode: number, raw: string, text: string, expectState: readonly string[]): { taskId: string } | { error: string } {
  let answer: JsonRpcAnswer;
  try {
    answer = JSON.parse(raw) as JsonRpcAnswer;
  } catch {
    return { error: `HTTP ${statusCode}, not JSON: ${raw.slice(0, 80)}` };
  }
  if (answer.error) return { error: `HTTP ${statusCode}, JSON-RPC ${answer.error.code}: ${String(answer.error.message).slice(0, 100)}` };
  if (statusCode !== 200) return { error: `HTTP ${statusCode}` };
  const task = answer.result?.task;
  if (!task?.id) return { error: 'result is not a task' };
  const state = task.status?.state ?? '(none)';
  if (!expectState.includes(state)) return { error: `task state ${state}` };
  if (state === 'TASK_STATE_COMPLETED') {
    const expected = `echo: ${text}`;
    const found = (task.artifacts ?? []).some((artifact) => (artifact.parts ?? []).some((part) => part.text === expected));
    if (!found) return { error: 'completed without the expected artifact text' };
  }
  return { taskId: task.id };
}

export function countError(kinds: Record<string, number>, kind: string): void {
  kinds[kind] = (kinds[kind] ?? 0) + 1;
}

// ---------------------------------------------------------------------------------------------
// /proc readings of a process (Linux).

export type ProcMemory = { rssKiB: number; hwmKiB: number; threads: number };

export function procMemory(pid: number): ProcMemory {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? Number.NaN);
  return { rssKiB: field('VmRSS'), hwmKiB: field('VmHWM'), threads: field('Threads') };
}

/** Open descriptors of a process, and how many of them are sockets. */
export function procDescriptors(pid: number): { total: number; sockets: number } {
  let total = 0;
  let sockets = 0;
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    total += 1;
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith('socket:')) sockets += 1;
    } catch {
      // Closed meanwhile.
    }
  }
  return { total, sockets };
}

/** "Max open files" soft and hard limits of a process. */
export function procOpenFileLimit(pid: number | 'self'): { soft: string; hard: string } {
  const limits = readFileSync(`/proc/${pid}/limits`, 'utf8');
  const match = /^Max open files\s+(\S+)\s+(\S+)/m.exec(limits);
  return { soft: match?.[1] ?? '?', hard: match?.[2] ?? '?' };
}

function childrenOf(pid: number): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // Field 4 (ppid) comes after the command in parentheses, which may itself contain spaces.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) found.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return found;
}

export function descendantsOf(pid: number): number[] {
  const all: number[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    for (const child of childrenOf(queue.shift()!)) {
      all.push(child);
      queue.push(child);
    }
  }
  return all;
}

export function processCommand(pid: number): string {
  return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
}

function listeningInodes(port: number): Set<string> {
  const inodes = new Set<string>();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const columns = line.trim().split(/\s+/);
      if (columns.length < 10) continue;
      const localPort = parseInt(columns[1]!.split(':')[1] ?? '', 16);
      // State 0A is LISTEN.
      if (localPort === port && columns[3] === '0A') inodes.add(columns[9]!);
    }
  }
  return inodes;
}

/**
 * The process that holds the listening socket of `port`, among `pid` and its descendants (so a
 * launcher that spawned the real server would be seen through): the process actually serving.
 */
export function servingProcess(pid: number, port: number): { pid: number; command: string; descendants: number[] } | null {
  const inodes = listeningInodes(port);
  const descendants = descendantsOf(pid);
  for (const candidate of [pid, ...descendants]) {
    try {
      for (const fd of readdirSync(`/proc/${candidate}/fd`)) {
        let target = '';
        try {
          target = readlinkSync(`/proc/${candidate}/fd/${fd}`);
        } catch {
          continue;
        }
        const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
        if (inode && inodes.has(inode)) {
          return { pid: candidate, command: processCommand(candidate), descendants };
        }
      }
    } catch {
      // Gone meanwhile.
    }
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// Prometheus text.

/** Series without labels (and `name{}`), by name; labelled series keyed by their full text. */
export function parsePrometheus(text: string): Map<string, number> {
  const series = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue;
    const match = /^(\S+?(?:\{.*\})?)\s+(\S+)(?:\s+\d+)?$/.exec(line);
    if (match) series.set(match[1]!, Number(match[2]));
  }
  return series;
}

export async function scrapeMetrics(origin: string): Promise<Map<string, number> | null> {
  try {
    const response = await fetch(`${origin}/metrics`, { signal: AbortSignal.timeout(10_000) });
    const text = await response.text();
    return response.status === 200 ? parsePrometheus(text) : null;
  } catch {
    return null;
  }
}

export const mib = (kib: number) => kib / 1024;

/**
 * The collector of the benches that trace (bench:a2a's BENCH_TRACING, bench:tracing), in a process
 * of its own: answers every OTLP/HTTP export with an empty ExportTraceServiceResponse once it has
 * read the body, and counts what it received (GET /stats).
 */
const OTLP_SINK_SOURCE = `
const http = require('node:http');
let requests = 0, bytes = 0;
http.createServer((request, response) => {
  if (request.method === 'GET') { response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ requests, bytes })); return; }
  request.on('data', (chunk) => { bytes += chunk.length; });
  request.on('end', () => { requests += 1; response.writeHead(200, { 'content-type': 'application/x-protobuf' }).end(); });
}).listen(Number(process.argv[1]), '127.0.0.1');
`;

export async function startOtlpSink(): Promise<{ child: ManagedChild; origin: string }> {
  const port = await freePort();
  const child = new ManagedChild('OTLP sink', process.execPath, ['-e', OTLP_SINK_SOURCE, String(port)]);
  const origin = `http://127.0.0.1:${port}`;
  await waitUntilReady(child, `${origin}/stats`, 10_000);
  return { child, origin };
}
