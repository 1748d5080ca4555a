import pg from 'pg';
import { sql, type DatabasePool } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { DatabaseReturn } from '../../../src/db/database-return.js';
import { createDatabasePool, isConnectionError } from '../../../src/db/pool.js';
import { ADMIN_URL, createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// DatabaseReturn.again: work whose connection was lost is done again once the database answers
// (src/queue/once-database-answers.ts wraps the queues' processors with it). The lost connection
// is a real one: another session terminates the work's backend while its statement runs.

let db: TestDatabase;
let pool: DatabasePool;

beforeAll(async () => {
  db = await createTestDatabase();
  pool = await createDatabasePool(db.url, { maximumPoolSize: 4 });
});
afterAll(async () => {
  await pool?.end();
  await db?.drop();
});

const pid = z.object({ pid: z.number() });

/** A statement whose backend another session terminates while it runs (a crash, as the pool sees it). */
async function queryCutOff(on: DatabasePool = pool): Promise<number> {
  return on.connect(async (connection) => {
    const own = await connection.oneFirst(sql.type(pid)`SELECT pg_backend_pid() AS pid`);
    const terminate = new Promise((resolve) => setTimeout(resolve, 100)).then(() => db.pool.query(sql.unsafe`SELECT pg_terminate_backend(${own})`));
    try {
      return await connection.oneFirst(sql.type(pid)`SELECT pg_sleep(5)::text::int + 0 AS pid`);
    } finally {
      await terminate;
    }
  });
}

describe('DatabaseReturn.again', () => {
  it('does the work again once the database answers when its connection was lost, and says so once', async () => {
    const databaseReturn = new DatabaseReturn(pool, 50);
    const lost: unknown[] = [];
    let calls = 0;
    const result = await databaseReturn.again(
      async () => {
        calls += 1;
        if (calls === 1) return queryCutOff();
        return pool.oneFirst(sql.type(pid)`SELECT 7 AS pid`);
      },
      { withinMs: 5_000, times: 3, onLost: (error) => lost.push(error) },
    );
    expect(result).toBe(7);
    expect(calls).toBe(2);
    expect(lost).toHaveLength(1);
    expect(isConnectionError(lost[0])).toBe(true);
  });

  it('throws any other error at once, without doing the work again', async () => {
    const databaseReturn = new DatabaseReturn(pool, 50);
    let calls = 0;
    const failing = databaseReturn.again(
      async () => {
        calls += 1;
        return pool.query(sql.unsafe`SELECT * FROM no_such_table`);
      },
      { withinMs: 5_000, times: 3 },
    );
    await expect(failing).rejects.toThrow(/no_such_table/);
    expect(calls).toBe(1);
  });

  it('does the work again at most `times` times, then throws the lost connection', async () => {
    const databaseReturn = new DatabaseReturn(pool, 50);
    let calls = 0;
    const failing = databaseReturn.again(
      async () => {
        calls += 1;
        return queryCutOff();
      },
      { withinMs: 5_000, times: 2 },
    );
    await expect(failing).rejects.toSatisfy(isConnectionError);
    expect(calls).toBe(3);
  });

  it('throws the lost connection when the database does not answer in time, or at once when stopped', async () => {
    // A pool of one connection on a database that then refuses new connections: once its
    // connection is cut, every probe is refused.
    const onePool = await createDatabasePool(db.url, { maximumPoolSize: 1 });
    const admin = new pg.Client({ connectionString: ADMIN_URL });
    await admin.connect();
    try {
      await admin.query(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS false`);
      const databaseReturn = new DatabaseReturn(onePool, 50);
      let calls = 0;
      const work = async () => {
        calls += 1;
        return queryCutOff(onePool);
      };
      const startedAt = Date.now();
      await expect(databaseReturn.again(work, { withinMs: 600, times: 3 })).rejects.toSatisfy(isConnectionError);
      expect(calls).toBe(1);
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(600);

      const stop = new AbortController();
      stop.abort();
      const stoppedAt = Date.now();
      await expect(databaseReturn.again(work, { withinMs: 60_000, times: 3, stop: stop.signal })).rejects.toSatisfy(isConnectionError);
      expect(calls).toBe(2);
      expect(Date.now() - stoppedAt).toBeLessThan(5_000);
    } finally {
      await admin.query(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`);
      await admin.end();
      await onePool.end();
    }
  });
});
