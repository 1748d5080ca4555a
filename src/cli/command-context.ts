import type { DatabasePool } from 'slonik';
import type { KeelConfig } from '../config/load-config.js';
import type { KeelLogger } from '../log/logger.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { loadMasterKeys } from '../sealing/master-key-store.js';
import { MasterKeyRing } from '../sealing/master-key.js';
import { createSealer, type Sealer } from '../sealing/sealer.js';
import { queueBackendFor } from '../queue/queue-backend-for.js';
import { CliExit, EXIT, withDatabase } from './cli-support.js';

export type CommandContext = { pool: DatabasePool; logger: KeelLogger; sealer: Sealer; queues: KeelQueues; config: KeelConfig };

/**
 * What commands that change runs need: the database, the master key (never created here) and the
 * queues, to hand a resumed run to the workers.
 */
export async function withCommandContext<T>(config: KeelConfig, fn: (context: CommandContext) => Promise<T>): Promise<T> {
  return withDatabase(config, async (pool, logger, databaseUrl) => {
    const keys = await loadMasterKeys(config.security.masterKeyFile);
    if (!keys.ok) {
      throw new CliExit(EXIT.masterKey, keys.reason === 'invalid' ? keys.message : `no master key at ${config.security.masterKeyFile} or in KEEL_MASTER_KEY`);
    }
    // BullMQ (about 200 modules) is loaded by the commands that enqueue, not by every command of
    // their group: `keel runs list` reads rows and never needs it.
    const { KeelQueues } = await import('../queue/keel-queues.js');
    const queues = new KeelQueues(queueBackendFor(config, databaseUrl), logger);
    try {
      return await fn({ pool, logger, sealer: createSealer(new MasterKeyRing(keys.keys)), queues, config });
    } finally {
      await queues.close().catch(() => undefined);
    }
  });
}
