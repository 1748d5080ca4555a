import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createDatabasePool, type DatabasePool } from '../../../src/db/pool.js';
import { silentLinkSessionSettings } from '../../../src/db/silent-link.js';
import { BullmqSchema } from '../../../src/queue/bullmq-schema.js';
import { QueuePool } from '../../../src/queue/queue-pool.js';
import { createEmptyDatabase } from '../../support/test-database.js';

// database.linkTimeoutSeconds (decision 0092) reaches the server: every session of Keel's pool and
// of the queue pools carries the keepalive and tcp_user_timeout that end it when its client goes
// silent (the queue pools keep their search_path beside them).

const NAMES = ['tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout'] as const;
const setting = z.object({ setting: z.string() });

let db: { url: string; drop: () => Promise<void> };
let pool: DatabasePool;
let queuePool: QueuePool;

beforeAll(async () => {
  db = await createEmptyDatabase();
  // Over TCP (the settings do nothing on a Unix socket, and Postgres then shows 0).
  pool = await createDatabasePool(db.url, { linkTimeoutSeconds: 8 });
  queuePool = new QueuePool(db.url, 1, new BullmqSchema(), 8);
});
afterAll(async () => {
  await pool?.end();
  await queuePool?.end();
  await db?.drop();
});

describe('database.linkTimeoutSeconds', () => {
  it("is set on the server for the sessions of Keel's pool", async () => {
    const expected = silentLinkSessionSettings(8);
    for (const name of NAMES) {
      const value = await pool.oneFirst(sql.type(setting)`SELECT setting FROM pg_settings WHERE name = ${name}`);
      expect(Number(value), name).toBe(expected[name]);
    }
  });

  it('is set on the sessions of a queue pool, beside its search_path', async () => {
    const expected = silentLinkSessionSettings(8);
    for (const name of NAMES) {
      const { rows } = await queuePool.query<{ setting: string }>('SELECT setting FROM pg_settings WHERE name = $1', [name]);
      expect(Number(rows[0]!.setting), name).toBe(expected[name]);
    }
    const { rows } = await queuePool.query<{ search_path: string }>('SHOW search_path');
    expect(rows[0]!.search_path).toContain('bullmq');
  });
});
