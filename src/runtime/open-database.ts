import type { DatabasePool } from 'slonik';
import type { KeelConfig } from '../config/load-config.js';
import { createDatabasePool, isConnectionError, type PoolOptions } from '../db/pool.js';
import { lockDataDir, runningEmbeddedUrl, startEmbeddedPostgres, type DataDirLock, type EmbeddedPostgres } from '../db/embedded-postgres.js';
import type { KeelLogger } from '../log/logger.js';

export type DatabaseHandle = {
  url: string;
  pool: DatabasePool;
  /** The embedded server this process started, if any. */
  embedded: EmbeddedPostgres | null;
  close: () => Promise<void>;
};

export type OpenDatabaseResult = { ok: true; database: DatabaseHandle } | { ok: false; message: string };

/** What a command or `keel start` says when Postgres does not answer. */
export const unreachableDatabase = (error: unknown) => `cannot reach the database: ${(error as Error).message}`;

/** A pool on a server that is up (the pool connects when it is made): an unreachable one is a message, not a throw. */
async function externalDatabase(url: string, poolOptions: PoolOptions): Promise<OpenDatabaseResult> {
  try {
    const pool = await createDatabasePool(url, poolOptions);
    return { ok: true, database: { url, pool, embedded: null, close: () => pool.end() } };
  } catch (error) {
    if (isConnectionError(error)) return { ok: false, message: unreachableDatabase(error) };
    throw error;
  }
}

/**
 * The database of a Keel process: `database.url` when set, else the embedded Postgres in dataDir.
 * `keel start` (mode 'server') owns the data directory and refuses a second server on it. Short
 * commands (mode 'command') use the server that is up, or start the embedded one for themselves.
 */
export async function openDatabase(
  config: KeelConfig,
  logger: KeelLogger,
  mode: 'server' | 'command',
  given: { maximumPoolSize?: number; applicationName?: string } = {},
): Promise<OpenDatabaseResult> {
  const poolOptions: PoolOptions = { ...given, linkTimeoutSeconds: config.database.linkTimeoutSeconds };
  if (config.database.url) return externalDatabase(config.database.url, poolOptions);

  const locked = lockDataDir(config.dataDir);
  let lock: DataDirLock | null = null;
  if (!locked.ok) {
    if (mode === 'server') {
      return {
        ok: false,
        message: `another Keel process (pid ${locked.pid}) is already using the data directory ${config.dataDir}; stop it or start this one with another dataDir`,
      };
    }
    const url = runningEmbeddedUrl(config.dataDir);
    if (!url) return { ok: false, message: `Keel (pid ${locked.pid}) holds ${config.dataDir} but its embedded database is not up yet; try again in a moment` };
    return externalDatabase(url, poolOptions);
  }
  lock = locked.lock;

  const started = await startEmbeddedPostgres(config.dataDir, logger);
  if (!started.ok) {
    lock.release();
    return { ok: false, message: started.message };
  }
  const pool = await createDatabasePool(started.server.url, poolOptions);
  const held = lock;
  return {
    ok: true,
    database: {
      url: started.server.url,
      pool,
      embedded: started.server,
      close: async () => {
        await pool.end().catch(() => undefined);
        await started.server.stop().catch((error: Error) => logger.warn({ err: error }, 'embedded Postgres did not stop cleanly'));
        held.release();
      },
    },
  };
}
