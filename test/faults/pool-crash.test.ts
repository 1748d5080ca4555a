import { sql, type DatabasePool } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createDatabasePool, probeDatabase } from '../../src/db/pool.js';
import { until } from './support/scenario.js';
import { sleep, type CrashMode } from './support/services.js';
import { useFaultSuite } from './support/suite.js';

// Keel's database pool across a Postgres crash, without Keel around it: every pooled connection is
// running a query when the server dies. slonik 47 left such connections in the pool for ever
// (PENDING_DESTROY), so the pool never opened a connection to the restarted server and every
// checkout waited without end. The pool must be whole again within seconds of the server's return.

// Only the private Postgres: no Keel, no model, no receiver, no Redis.
const suite = useFaultSuite({ receiver: null, model: null, redis: 'none' });

describe('the database pool across a Postgres crash', () => {
  it.each<CrashMode>(['immediate', 'kill'])('%s: connections that die mid-query leave the pool, which serves again', async (mode) => {
    const { postgres } = suite;
    const pool: DatabasePool = await createDatabasePool(await postgres.createDatabase(`pool_crash_${mode}`), { maximumPoolSize: 5 });
    let stopped = false;
    let answered = 0;
    // Twice as many callers as connections: every connection is busy when the server dies.
    const callers = Array.from({ length: 10 }, async () => {
      while (!stopped) {
        try {
          await pool.query(sql.unsafe`SELECT pg_sleep(0.02)`);
          answered += 1;
        } catch {
          await sleep(50);
        }
      }
    });
    try {
      expect(await until(() => answered > 50, 10_000)).toBe(true);
      const report = await postgres.crash(mode, 2000);
      expect(report.recovered, 'Postgres replayed its WAL').toBe(true);
      const before = answered;
      const serving = await until(async () => answered > before + 20 && (await probeDatabase(pool, 1000)).ok, 10_000, 50);
      const state = pool.state();
      expect(serving, `the pool serves again; state ${JSON.stringify(state)}`).toBe(true);
      expect(state.pendingDestroyConnections).toBe(0);
      expect(await pool.oneFirst(sql.type(z.object({ ok: z.number() }))`SELECT 1 AS ok`)).toBe(1);
    } finally {
      stopped = true;
      await Promise.race([Promise.all(callers), sleep(5000)]);
      await pool.end();
    }
  }, 60_000);
});
