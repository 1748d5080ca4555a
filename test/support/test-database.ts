import { randomBytes } from 'node:crypto';
import pg from 'pg';
import type { DatabasePool } from 'slonik';
import { createClient } from '../../src/auth/client-repository.js';
import { migrate } from '../../src/db/migrate.js';
import { createDatabasePool } from '../../src/db/pool.js';

// Each test file gets its own database, so files run in parallel and never see each other's rows.

export const ADMIN_URL = process.env.KEEL_TEST_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

export type TestDatabase = { name: string; url: string; pool: DatabasePool; drop: () => Promise<void> };

export function databaseUrl(name: string): string {
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

async function admin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: ADMIN_URL });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

export async function createEmptyDatabase(): Promise<{ name: string; url: string; drop: () => Promise<void> }> {
  const name = `keel_test_${randomBytes(6).toString('hex')}`;
  await admin((client) => client.query(`CREATE DATABASE ${name}`));
  return {
    name,
    url: databaseUrl(name),
    drop: () => admin((client) => client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)).then(() => undefined),
  };
}

/** A fresh, migrated database with a slonik pool on it. */
export async function createTestDatabase(options: { migrate?: boolean } = {}): Promise<TestDatabase> {
  const database = await createEmptyDatabase();
  if (options.migrate !== false) {
    const result = await migrate(database.url);
    if (!result.ok) throw new Error(result.message);
  }
  const pool = await createDatabasePool(database.url, { maximumPoolSize: 10 });
  return {
    ...database,
    pool,
    drop: async () => {
      await pool.end().catch(() => undefined);
      await database.drop();
    },
  };
}

/** Creates an A2A client in the test database and returns its id (the owner of the tasks a test writes directly). */
export async function createTestClient(db: TestDatabase, name: string): Promise<string> {
  const created = await createClient(db.pool, name);
  if (!created.ok) throw new Error(`client ${name}: ${created.reason}`);
  return created.client.id;
}
