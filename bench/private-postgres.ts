import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { unixSocketDirFor } from '../src/db/unix-socket-dir.js';

// A Postgres cluster of a benchmark's own: the machine's PostgreSQL server binaries (the same major
// version as the server at `mirrorFrom`), a fresh data directory on the same disk as the default
// temporary directory, and the settings of the `mirrorFrom` server that bear on speed, except
// max_connections, which is set high. For benchmarks whose targets hold more connections than a
// shared server allows (several Keel processes on the Postgres queue backend hold a hundred or
// more), and so that a benchmark neither takes connections from other work on the shared server
// nor loses its own to it. Trust authentication, on loopback TCP and on a Unix socket in its data
// directory (`socketUrl`), the way a client on the same machine usually connects.

/** Settings copied from the mirrored server (those that change how fast a commit or a query is). */
const MIRRORED_SETTINGS = [
  'shared_buffers',
  'fsync',
  'synchronous_commit',
  'full_page_writes',
  'wal_level',
  'wal_buffers',
  'wal_compression',
  'wal_sync_method',
  'commit_delay',
  'max_wal_size',
  'min_wal_size',
  'checkpoint_timeout',
  'checkpoint_completion_target',
  'autovacuum',
  'work_mem',
  'maintenance_work_mem',
  'effective_cache_size',
  'random_page_cost',
  'jit',
  'huge_pages',
  'TimeZone',
];

export type PrivatePostgres = {
  /** Superuser URL of the `postgres` database, over loopback TCP. */
  adminUrl: string;
  /**
   * The same URL (or another database's on this cluster) with the host replaced by the cluster's
   * Unix socket directory; null when the data directory's path is too long for a socket's.
   */
  socketUrl: ((url: string) => string) | null;
  version: string;
  dataDir: string;
  /** The postmaster's pid. */
  pid: number;
  /** What was copied from the mirrored server, as `name=value`. */
  settings: string[];
  maxConnections: number;
  /** Fast shutdown, then the data directory removed. */
  stop: () => Promise<void>;
  /** For an exit handler: immediate shutdown, synchronous, no clean-up of the data directory. */
  kill: () => void;
};

export type PrivatePostgresOptions = {
  /** A server to copy the version and settings from (the machine's); optional. */
  mirrorFrom?: string;
  maxConnections?: number;
  /** Where the server binaries are; else /usr/lib/postgresql/<major>/bin, else `pg_config --bindir`. */
  binDir?: string;
  signal?: AbortSignal;
  /** Told of the data directory as soon as it exists, and of the server's pid as soon as it runs (for a clean-up watchdog). */
  onDataDir?: (dir: string) => void;
  onServer?: (pid: number, dir: string) => void;
  /**
   * One more address to listen on, and the network (CIDR) trusted on it: the test hosts' network of
   * bench:a2a's hosts mode (BENCH_KEEL_HOSTS), whose Keel processes connect over TCP from other
   * network namespaces.
   */
  network?: { address: string; cidr: string };
};

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

/** Postgres refuses to run as root: as root, run it as the `postgres` system user. */
function runAs(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  const line = readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((entry) => entry.startsWith('postgres:'));
  if (!line) throw new Error('running as root needs a "postgres" system user to run a private Postgres as');
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

async function mirrored(url: string): Promise<{ major: number; settings: string[]; locale: string | null }> {
  const client = new pg.Client({ connectionString: url, application_name: 'bench-private-postgres' });
  await client.connect();
  try {
    const version = await client.query<{ n: string }>('SHOW server_version_num');
    const { rows } = await client.query<{ name: string; value: string }>(
      `SELECT name, current_setting(name) AS value FROM pg_settings WHERE name = ANY($1::text[]) ORDER BY name`,
      [MIRRORED_SETTINGS],
    );
    const collate = await client.query<{ datcollate: string }>('SELECT datcollate FROM pg_database WHERE datname = current_database()');
    return {
      major: Math.floor(Number(version.rows[0]!.n) / 10000),
      settings: rows.map((row) => `${row.name}=${row.value}`),
      locale: collate.rows[0]?.datcollate ?? null,
    };
  } finally {
    await client.end().catch(() => undefined);
  }
}

function findBinDir(major: number | null, explicit?: string): string {
  const candidates = [explicit, major === null ? undefined : `/usr/lib/postgresql/${major}/bin`];
  for (const dir of candidates) if (dir && existsSync(join(dir, 'postgres')) && existsSync(join(dir, 'initdb'))) return dir;
  try {
    const dir = execFileSync('pg_config', ['--bindir'], { encoding: 'utf8' }).trim();
    if (existsSync(join(dir, 'postgres')) && existsSync(join(dir, 'initdb'))) return dir;
  } catch {
    // No pg_config.
  }
  throw new Error(`no PostgreSQL server binaries found${major === null ? '' : ` for version ${major}`} (set BENCH_PG_BINDIR, or use the machine's server)`);
}

export async function startPrivatePostgres(options: PrivatePostgresOptions = {}): Promise<PrivatePostgres> {
  const maxConnections = options.maxConnections ?? 500;
  let mirror: Awaited<ReturnType<typeof mirrored>> | null = null;
  if (options.mirrorFrom) mirror = await mirrored(options.mirrorFrom);
  const binDir = findBinDir(mirror?.major ?? null, options.binDir);
  const user = runAs();
  const dataDir = mkdtempSync(join(tmpdir(), 'keel-bench-pg-'));
  options.onDataDir?.(dataDir);
  if (user) chownSync(dataDir, user.uid, user.gid);
  const spawnOptions = { cwd: dataDir, ...(user ? { uid: user.uid, gid: user.gid } : {}) };

  const cleanUp = () => rmSync(dataDir, { recursive: true, force: true });
  try {
    const locale = mirror?.locale && /^[A-Za-z0-9_.@-]+$/.test(mirror.locale) ? ['--locale', mirror.locale] : ['--no-locale'];
    await promisify(execFile)(join(binDir, 'initdb'), ['-D', dataDir, '-U', 'postgres', '--auth', 'trust', '--encoding', 'UTF8', ...locale, '--no-sync'], spawnOptions);
  } catch (error) {
    cleanUp();
    const stderr = String((error as { stderr?: unknown }).stderr ?? '').trim();
    throw new Error(`initdb failed: ${stderr || (error as Error).message}`);
  }
  if (options.network) appendFileSync(join(dataDir, 'pg_hba.conf'), `host all all ${options.network.cidr} trust\n`);

  const port = await freePort();
  // A socket's path holds at most 107 bytes (sun_path); a longer TMPDIR leaves the cluster on TCP only.
  const socketFits = unixSocketDirFor(dataDir, port) !== null;
  const settings = mirror?.settings ?? [];
  const flags = [
    '-D',
    dataDir,
    '-c',
    `port=${port}`,
    '-c',
    `listen_addresses=127.0.0.1${options.network ? `,${options.network.address}` : ''}`,
    '-c',
    // The data directory: the server's own, private, and a short path (a socket path has 107 bytes).
    `unix_socket_directories=${socketFits ? dataDir : ''}`,
    '-c',
    `max_connections=${maxConnections}`,
    // Statements per request (bench:a2a): loaded, but tracking nothing unless a database asks for
    // it (ALTER DATABASE ... SET pg_stat_statements.track), so other databases pay nothing for it.
    '-c',
    'shared_preload_libraries=pg_stat_statements',
    '-c',
    'pg_stat_statements.track=none',
    ...settings.flatMap((setting) => ['-c', setting]),
  ];
  const child: ChildProcess = spawn(join(binDir, 'postgres'), flags, { ...spawnOptions, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  if (child.pid !== undefined) options.onServer?.(child.pid, dataDir);
  const output: string[] = [];
  const keep = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) if (line.trim() !== '') output.push(line);
    while (output.length > 40) output.shift();
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  let exited = false;
  const exit = new Promise<void>((resolve) => {
    child.on('exit', () => {
      exited = true;
      resolve();
    });
    child.on('error', (error) => {
      output.push(`spawn failed: ${error.message}`);
      exited = true;
      resolve();
    });
  });
  const signalServer = (signal: NodeJS.Signals) => {
    if (exited || child.pid === undefined) return;
    try {
      process.kill(child.pid, signal);
    } catch {
      // Gone already.
    }
  };
  const stop = async () => {
    // SIGINT: fast shutdown (sessions ended, a checkpoint, exit); SIGQUIT if it takes too long.
    signalServer('SIGINT');
    const timer = setTimeout(() => signalServer('SIGQUIT'), 15_000);
    await exit;
    clearTimeout(timer);
    cleanUp();
  };

  const adminUrl = `postgres://postgres@127.0.0.1:${port}/postgres`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (exited) {
      cleanUp();
      throw new Error(`the private Postgres exited during start:\n${output.join('\n')}`);
    }
    if (options.signal?.aborted || Date.now() > deadline) {
      await stop();
      throw options.signal?.aborted ? (options.signal.reason as Error) : new Error(`the private Postgres did not accept connections within 60 s:\n${output.join('\n')}`);
    }
    const client = new pg.Client({ connectionString: adminUrl, connectionTimeoutMillis: 2000 });
    try {
      await client.connect();
      const version = (await client.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
      await client.end();
      const socketUrl = socketFits
        ? (url: string) => {
            const parsed = new URL(url);
            // libpq's and node-postgres's form: a host that is a directory, percent-encoded.
            parsed.hostname = encodeURIComponent(dataDir);
            return parsed.toString();
          }
        : null;
      return { adminUrl, socketUrl, version, dataDir, pid: child.pid!, settings, maxConnections, stop, kill: () => signalServer('SIGQUIT') };
    } catch {
      await client.end().catch(() => undefined);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}
