import type { DatabasePool } from 'slonik';
import type { KeelConfig } from '../config/load-config.js';
import type { KeelLogger } from '../log/logger.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import type { Sealer } from '../sealing/sealer.js';

/** What workers and HTTP handlers share inside one Keel process. */
export type KeelContext = {
  config: KeelConfig;
  pool: DatabasePool;
  queues: KeelQueues;
  sealer: Sealer;
  logger: KeelLogger;
  /** Stamped into `runs.claimed_by`: unique per process. */
  workerId: string;
};
