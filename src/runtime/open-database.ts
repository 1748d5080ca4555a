import type { DatabasePool } from 'slonik';
import type { KeelConfig } from '../config/load-config.js';
import { createDatabasePool } from '../db/pool.js';
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

/**
 * The database of a Keel process: `database.url` when set, else the embedded Postgres in dataDir.
 * `keel start` (mode 'server') owns the data directory and refuses a second server on it. Short
 * commands (mode 'command') use the server that is up, or start the embedded one for themselves.
 */
export async function openDatabase(
  config: KeelConfig,
  logger: KeelLogger,
  mode: 'server' | 'command',
  poolOptions: { maximumPoolSize?: number; applicationName?: string } = {},
): Promise<OpenDatabaseResult> {
  if (config.database.url) {
    const pool = await createDatabasePool(config.database.url, poolOptions);
    return { ok: true, database: { url: config.database.url, pool, embedded: null, close: () => pool.end() } };
  }

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
    const pool = await createDatabasePool(url, poolOptions);
    return { ok: true, database: { url, pool, embedded: null, close: () => pool.end() } };
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
