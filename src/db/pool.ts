import {
  createDateTypeParser,
  createIntervalTypeParser,
  createNumericTypeParser,
  createPool,
  createTimestampTypeParser,
  createTimestampWithTimeZoneTypeParser,
  sql,
  type DatabasePool,
} from 'slonik';
import { z } from 'zod';

export type { DatabasePool };

export type PoolOptions = { maximumPoolSize?: number; applicationName?: string };

/**
 * The one slonik pool of a Keel process. Connections are not reset with DISCARD ALL on release:
 * Keel keeps no session state outside the routines that take a dedicated connection (advisory
 * locks, LISTEN), and the extra round trip per checkout is measurable on the hot path.
 */
export async function createDatabasePool(url: string, options: PoolOptions = {}): Promise<DatabasePool> {
  const withName = new URL(url);
  if (options.applicationName && !withName.searchParams.has('application_name')) {
    withName.searchParams.set('application_name', options.applicationName);
  }
  return createPool(withName.toString(), {
    maximumPoolSize: options.maximumPoolSize ?? 20,
    idleTimeout: 30_000,
    statementTimeout: 60_000,
    connectionTimeout: 10_000,
    resetConnection: async () => undefined,
    // Counters and revisions are int8 but stay far below 2^53: read them as numbers, timestamps as
    // epoch milliseconds.
    typeParsers: [
      { name: 'int8', parse: (value: string) => Number(value) },
      createDateTypeParser(),
      createIntervalTypeParser(),
      createNumericTypeParser(),
      createTimestampTypeParser(),
      createTimestampWithTimeZoneTypeParser(),
    ],
  });
}

/** Answers whether the database is reachable (for /readyz and doctor). */
export async function pingDatabase(pool: DatabasePool): Promise<boolean> {
  try {
    return (await pool.oneFirst(sql.type(z.object({ ok: z.number() }))`SELECT 1 AS ok`)) === 1;
  } catch {
    return false;
  }
}
