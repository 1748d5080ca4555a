import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';

// Row updates of a table as Postgres's own statistics count them (pg_stat_user_tables).

const writes = z.object({ updates: z.number(), hot: z.number() });

/**
 * The table's updates and HOT updates as the shared statistics hold them, after this connection's
 * own pending counts are flushed: pg_stat_force_next_flush() makes the backend report them when
 * that statement's transaction ends, and pg_stat_clear_snapshot() drops any cached reading.
 */
async function flushedWrites(connection: CommonQueryMethods, table: string) {
  await connection.query(sql.unsafe`SELECT pg_stat_force_next_flush()`);
  await connection.query(sql.unsafe`SELECT pg_stat_clear_snapshot()`);
  return connection.one(sql.type(writes)`
    SELECT n_tup_upd::int AS updates, n_tup_hot_upd::int AS hot FROM pg_stat_user_tables WHERE relname = ${table}`);
}

/** The writes `step` caused on `table` through `connection`: how many row updates, and how many of them were HOT. */
export async function writesOf(connection: CommonQueryMethods, table: string, step: () => Promise<unknown>) {
  const before = await flushedWrites(connection, table);
  await step();
  const after = await flushedWrites(connection, table);
  return { updates: after.updates - before.updates, hot: after.hot - before.hot };
}
