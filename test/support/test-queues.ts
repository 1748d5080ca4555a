import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import type { QueueBackend } from '../../src/queue/keel-queues.js';

// The whole suite runs on both queue backends: KEEL_TEST_QUEUE=redis|postgres (default postgres).
// On Redis each test file gets its own key prefix; on Postgres its own database holds the queues.

export type TestQueueKind = 'redis' | 'postgres';

export function testQueueKind(): TestQueueKind {
  const kind = process.env.KEEL_TEST_QUEUE ?? 'postgres';
  if (kind !== 'redis' && kind !== 'postgres') throw new Error(`KEEL_TEST_QUEUE must be redis or postgres, not ${kind}`);
  return kind;
}

export const TEST_REDIS_URL = process.env.KEEL_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';

export function testQueuePrefix(): string {
  return `kt${randomBytes(5).toString('hex')}`;
}

export function testQueueBackend(databaseUrl: string, prefix = testQueuePrefix()): QueueBackend {
  return testQueueKind() === 'redis'
    ? { kind: 'redis', url: TEST_REDIS_URL, prefix }
    : { kind: 'postgres', connectionString: databaseUrl, prefix };
}

/** Deletes every key under these queue prefixes from Redis (other test files share the server: never FLUSHALL); how many. */
export async function deleteQueueKeys(prefixes: readonly string[], redisUrl = TEST_REDIS_URL): Promise<number> {
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  let deleted = 0;
  try {
    for (const prefix of prefixes) {
      for (let cursor = '0'; ; ) {
        const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 500);
        if (keys.length > 0) deleted += await redis.del(...keys);
        cursor = next;
        if (cursor === '0') break;
      }
    }
  } finally {
    await redis.quit();
  }
  return deleted;
}
