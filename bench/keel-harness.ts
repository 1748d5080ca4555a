import { spawn, type ChildProcess } from 'node:child_process';
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

// Shared by bench:lag and bench:memory: Keel started as `node bin/keel.js start` in a child process
// of its own (a process group of its own, so a Ctrl-C reaches only the harness, which stops the
// children in order and drops its databases), on a fresh bench database, the queue on Redis or on
// Postgres; environment knobs; /proc readings of a child (RSS, descriptors, limits); Prometheus
// text parsing. Nothing here talks to anything but loopback.

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
  return {
    fail,
    positive: (name: string, fallback: number) => number(name, fallback, (value) => value > 0, 'a positive number'),
    nonNegative: (name: string, fallback: number) => number(name, fallback, (value) => value >= 0, 'a number ≥ 0'),
    positiveInt: (name: string, fallback: number) => number(name, fallback, (value) => Number.isInteger(value) && value > 0, 'a positive integer'),
    choice: <T extends string>(name: string, fallback: T, allowed: readonly T[]): T => {
      const value = (process.env[name] ?? fallback).trim() as T;
      if (!allowed.includes(value)) fail(`${name}: expected ${allowed.join(' or ')}, got "${value}"`);
      return value;
    },
  };
}

export type QueueBackend = 'redis' | 'postgres';
export const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';

// ---------------------------------------------------------------------------------------------
// Interruption: the first SIGINT/SIGTERM aborts `interrupted` (every wait and request listens on
// it; the benches then stop Keel and drop their databases), a later one kills the children.

export const interrupted = new AbortController();
setMaxListeners(0, interrupted.signal);
const liveChildren = new Set<ManagedChild>();
const liveDatabases = new Set<string>();

export function installInterruptHandlers(bench: string): void {
  let firstSignalAt = 0;
  const onSignal = (signal: NodeJS.Signals) => {
    const now = Date.now();
    if (firstSignalAt === 0) {
      firstSignalAt = now;
      console.error(`\n${bench}: ${signal}, stopping Keel and dropping the bench database (again to force)`);
      interrupted.abort(new Error(`interrupted by ${signal}`));
      return;
    }
    // tsx relays a terminal's Ctrl-C a second time within ~30 ms; only a later one means "force".
    if (now - firstSignalAt < 500) return;
    for (const child of liveChildren) child.kill('SIGKILL');
    if (liveDatabases.size > 0) console.error(`${bench}: left behind, drop by hand: ${[...liveDatabases].join(', ')}`);
    process.exit(130);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  process.on('exit', () => {
    for (const child of liveChildren) child.kill('SIGKILL');
  });
}

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

export class ManagedChild {
  readonly process: ChildProcess;
  private readonly output: string[] = [];
  /** The first lines the child printed, kept for good (e.g. the inspector's URL). */
  readonly firstLines: string[] = [];
  readonly exited: Promise<number | null>;
  private hasExited = false;

  constructor(
    readonly name: string,
    command: string,
    args: string[],
    env: NodeJS.ProcessEnv,
  ) {
    this.process = spawn(command, args, { cwd: repoRoot, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    liveChildren.add(this);
    const keep = (chunk: Buffer) => {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.trim() === '') continue;
        this.output.push(line);
        if (this.output.length > 60) this.output.shift();
        if (this.firstLines.length < 40) this.firstLines.push(line);
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

  get pid(): number {
    return this.process.pid ?? -1;
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
  async stop(graceMs = 15_000): Promise<number | null> {
    if (!this.running) return this.exited;
    this.kill('SIGTERM');
    const timer = setTimeout(() => this.kill('SIGKILL'), graceMs);
    const code = await this.exited;
    clearTimeout(timer);
    return code;
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

export async function withTrackedDatabase<T>(fn: (url: string) => Promise<T>): Promise<T> {
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

export async function withAdmin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
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
    ...options.env,
  };
  delete env.KEEL_QUEUE_REDIS_URL;
  if (options.queue === 'redis') env.KEEL_QUEUE_REDIS_URL = redisUrl;
  if (options.inspector) env.NODE_OPTIONS = `${env.NODE_OPTIONS ?? ''} --inspect=127.0.0.1:0`.trim();
  const origin = `http://127.0.0.1:${port}`;
  const child = new ManagedChild(options.name, process.execPath, [join(repoRoot, 'bin/keel.js'), 'start'], env);
  try {
    await waitUntilReady(child, `${origin}/readyz`, 90_000);
  } catch (error) {
    await child.stop();
    rmSync(dataDir, { recursive: true, force: true });
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
  rmSync(keel.dataDir, { recursive: true, force: true });
  return code;
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
