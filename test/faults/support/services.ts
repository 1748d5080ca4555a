import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import pg from 'pg';
import { loadEmbeddedPostgres } from '../../../src/db/embedded-postgres.js';

// Private services for the fault suite: an embedded Postgres and a redis-server of the suite's own,
// on free ports, so that stopping, restarting or flushing them never touches the machine's shared
// Postgres (5432) and Redis (6379) that other test files use at the same time.

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

/** A temporary directory others may enter (the embedded Postgres runs as the user postgres). */
export function openTempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  chmodSync(dir, 0o755);
  return dir;
}

export type PrivatePostgres = {
  port: number;
  /** The URL of a database on this server. */
  urlOf: (database: string) => string;
  createDatabase: (name: string) => Promise<string>;
  /** Fast shutdown (every connection dropped), `downMs` without a server, then the same server again. */
  restart: (downMs: number) => Promise<void>;
  /**
   * A crash: `immediate` is `pg_ctl stop -m immediate` (SIGQUIT to the postmaster: no checkpoint),
   * `kill` is SIGKILL of the postmaster (its backends are orphaned and exit when they notice). The
   * server is started again after `downMs` and goes through crash recovery (WAL replay), refusing
   * connections with "the database system is not yet accepting connections" meanwhile.
   */
  crash: (mode: CrashMode, downMs: number) => Promise<CrashReport>;
  /** SIGSTOP of the postmaster and every backend: connections stay open and nothing answers. */
  freeze: () => Promise<void>;
  /** SIGCONT of what `freeze` stopped. */
  thaw: () => Promise<void>;
  stop: () => Promise<void>;
};

export type CrashMode = 'immediate' | 'kill';
export type CrashReport = { mode: CrashMode; recovered: boolean; startAttempts: number };

/** The child process embedded-postgres keeps for the running server (a private field of the package). */
type WithProcess = { process?: ChildProcess };

const PG_USER = 'postgres';
const PG_PASSWORD = 'faults';

export async function startPrivatePostgres(): Promise<PrivatePostgres> {
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  let capture: ((line: string) => void) | null = null;
  let frozen: number[] = [];
  const dir = openTempDir('keel-faults-pg-');
  const port = await freePort();
  const instance = new EmbeddedPostgres({
    databaseDir: join(dir, 'pg'),
    user: PG_USER,
    password: PG_PASSWORD,
    port,
    persistent: true,
    authMethod: 'scram-sha-256',
    createPostgresUser: process.getuid?.() === 0,
    // Several Keel processes on the Postgres queue backend each hold a few dozen connections.
    // fsync=off: the crashes here are the server's processes' (SIGKILL of the postmaster, an
    // immediate stop), never the machine's, and a commit still writes its WAL to the operating
    // system before it returns (synchronous_commit stays on), so crash recovery replays the same WAL
    // it would with fsync; what is skipped is the flush to disk, about 0.1-0.6 ms of the machine's
    // CPU per commit on the CI machine (decision 0099).
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'max_connections=500', '-c', 'fsync=off'],
    onLog: (message: string) => capture?.(message),
    onError: () => undefined,
  });
  await instance.initialise();
  await instance.start();
  let running = true;
  const urlOf = (database: string) => `postgres://${PG_USER}:${PG_PASSWORD}@127.0.0.1:${port}/${database}`;
  return {
    port,
    urlOf,
    createDatabase: async (name) => {
      const client = new pg.Client({ connectionString: urlOf('postgres') });
      await client.connect();
      try {
        await client.query(`CREATE DATABASE ${name}`);
      } finally {
        await client.end();
      }
      return urlOf(name);
    },
    restart: async (downMs) => {
      await instance.stop();
      running = false;
      await sleep(downMs);
      await instance.start();
      running = true;
    },
    crash: async (mode, downMs) => {
      const server = (instance as unknown as WithProcess).process;
      if (!server?.pid) throw new Error('the private Postgres is not running');
      const exited = new Promise((resolve) => server.once('exit', resolve));
      process.kill(server.pid, mode === 'immediate' ? 'SIGQUIT' : 'SIGKILL');
      await exited;
      (instance as unknown as WithProcess).process = undefined;
      running = false;
      await sleep(downMs);
      // After SIGKILL, orphaned backends may still hold the old shared memory for a moment; the
      // postmaster refuses to start until they are gone, so the start is retried.
      const logs: string[] = [];
      let startAttempts = 0;
      for (;;) {
        startAttempts += 1;
        logs.length = 0;
        capture = (line) => logs.push(line);
        try {
          await instance.start();
          break;
        } catch {
          (instance as unknown as WithProcess).process = undefined;
          if (startAttempts >= 30) throw new Error(`the private Postgres did not start again:\n${logs.join('')}`);
          await sleep(500);
        } finally {
          capture = null;
        }
      }
      running = true;
      return { mode, recovered: logs.some((line) => /not properly shut down|automatic recovery|redo starts|interrupted/i.test(line)), startAttempts };
    },
    freeze: async () => {
      // The postmaster first, so it forks no backend while its children are stopped; then its
      // children, listed again until no new one shows up (one forked just before the postmaster
      // stopped). A backend may exit between the listing and its signal: that one is skipped.
      const postmaster = (instance as unknown as WithProcess).process?.pid;
      if (!postmaster) throw new Error('the private Postgres is not running');
      signal(postmaster, 'SIGSTOP');
      frozen = [postmaster];
      for (;;) {
        const added = serverProcesses(postmaster).filter((pid) => !frozen.includes(pid));
        if (added.length === 0) break;
        for (const pid of added) if (signal(pid, 'SIGSTOP')) frozen.push(pid);
      }
    },
    thaw: async () => {
      for (const pid of frozen) signal(pid, 'SIGCONT');
      frozen = [];
    },
    stop: async () => {
      for (const pid of frozen) signal(pid, 'SIGCONT');
      frozen = [];
      if (running) await instance.stop();
      running = false;
      try {
        rmSync(dir, { recursive: true, force: true });
      } catch {
        // leave it to the temp directory's cleanup
      }
    },
  };
}

/** Sends a signal; false when the process is gone already (ESRCH), which a backend may be. */
function signal(pid: number, name: NodeJS.Signals): boolean {
  try {
    process.kill(pid, name);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ESRCH') return false;
    throw error;
  }
}

/** The postmaster's children (backends and auxiliary processes), from /proc. */
function serverProcesses(postmaster: number | undefined): number[] {
  if (!postmaster) throw new Error('the private Postgres is not running');
  const children = readdirSync('/proc')
    .filter((entry) => /^\d+$/.test(entry))
    .filter((pid) => {
      try {
        // The fields after the command name, which is in parentheses and may hold spaces.
        const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
        return Number(fields[1]) === postmaster;
      } catch {
        return false;
      }
    })
    .map(Number);
  return [postmaster, ...children];
}

export type PrivateRedis = {
  url: string;
  flushAll: () => Promise<void>;
  /** Stops the server (its data is gone: no persistence), waits `downMs`, starts it again empty. */
  bounce: (downMs: number) => Promise<void>;
  stop: () => Promise<void>;
};

export async function startPrivateRedis(): Promise<PrivateRedis> {
  const port = await freePort();
  let child: ChildProcess | null = null;
  const launch = async () => {
    const started = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    await new Promise<void>((resolve, reject) => {
      let output = '';
      const timer = setTimeout(() => reject(new Error(`redis-server did not start:\n${output}`)), 10_000);
      started.stdout!.on('data', (chunk: Buffer) => {
        output += chunk.toString('utf8');
        if (output.includes('Ready to accept connections')) {
          clearTimeout(timer);
          resolve();
        }
      });
      started.on('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`redis-server exited (${code}):\n${output}`));
      });
    });
    child = started;
  };
  const halt = async () => {
    const current = child;
    child = null;
    if (!current || current.exitCode !== null || current.signalCode !== null) return;
    const exited = new Promise((resolve) => current.once('exit', resolve));
    current.kill('SIGKILL');
    await exited;
  };
  await launch();
  const url = `redis://127.0.0.1:${port}`;
  return {
    url,
    flushAll: async () => {
      const redis = new Redis(url, { maxRetriesPerRequest: 1 });
      try {
        await redis.flushall();
      } finally {
        redis.disconnect();
      }
    },
    bounce: async (downMs) => {
      await halt();
      await sleep(downMs);
      await launch();
    },
    stop: halt,
  };
}
