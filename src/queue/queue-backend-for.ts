import type { KeelConfig } from '../config/load-config.js';
import type { QueueBackend } from './keel-queues.js';

/** Redis when `queue.redisUrl` is set, else BullMQ's Postgres backend in Keel's own database. */
export function queueBackendFor(config: KeelConfig, databaseUrl: string, prefix: string = config.queue.prefix): QueueBackend {
  return config.queue.redisUrl
    ? { kind: 'redis', url: config.queue.redisUrl, prefix }
    : { kind: 'postgres', connectionString: databaseUrl, prefix, connectionsPerWorker: config.queue.connectionsPerWorker, linkTimeoutSeconds: config.database.linkTimeoutSeconds };
}
