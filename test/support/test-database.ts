import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { DEFAULT_SCHEMA, runMigrations } from 'bullmq';
import pg from 'pg';
import type { DatabasePool } from 'slonik';
import { createClient } from '../../src/auth/client-repository.js';
import { migrate, readMigrations } from '../../src/db/migrate.js';
import { createDatabasePool } from '../../src/db/pool.js';

// Each test file gets its own database, so files run in parallel and never see each other's rows.
//
// A migrated database is a copy of a template that holds Keel's migrations and BullMQ's schema
// (CREATE DATABASE ... TEMPLATE): migrating each file's database took 0.3 s for Keel's
// migrations and 1 s for BullMQ's schema on the Postgres queue backend, on every one of some 150
// files a run. The template's name carries a hash of the migrations and of BullMQ's version, so an
// edited or added migration makes a new one; the first process that needs it builds it under an
// advisory lock, and the others wait and copy it.

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

/** Session advisory lock key under which one process builds the migrated template. */
const TEMPLATE_LOCK_KEY = 4_242_000_077;

let template: Promise<string> | undefined;

/** The migrated template's name, built once per machine and migration set. */
function migratedTemplate(): Promise<string> {
  template ??= buildTemplate().catch((error: unknown) => {
    template = undefined;
    throw error;
  });
  return template;
}

function templateName(): string {
  const migrations = readMigrations();
  if (!migrations.ok) throw new Error(migrations.message);
  const hash = createHash('sha256');
  for (const migration of migrations.migrations) hash.update(`${migration.id}:${migration.checksum}\n`);
  const bullmq = JSON.parse(readFileSync(createRequire(import.meta.url).resolve('bullmq/package.json'), 'utf8')) as { version: string };
  hash.update(`bullmq ${bullmq.version}`);
  return `keel_template_${hash.digest('hex').slice(0, 16)}`;
}

async function buildTemplate(): Promise<string> {
  const name = templateName();
  await admin(async (client) => {
    await client.query('SELECT pg_advisory_lock($1)', [TEMPLATE_LOCK_KEY]);
    try {
      const exists = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
      if (exists.rowCount) return;
      // Built under another name and renamed when complete: a process killed half-way leaves no
      // template that looks ready.
      const building = `${name}_building`;
      await client.query(`DROP DATABASE IF EXISTS ${building} WITH (FORCE)`);
      await client.query(`CREATE DATABASE ${building}`);
      const migrated = await migrate(databaseUrl(building));
      if (!migrated.ok) throw new Error(migrated.message);
      const schemaClient = new pg.Client({ connectionString: databaseUrl(building) });
      await schemaClient.connect();
      try {
        await runMigrations(schemaClient, DEFAULT_SCHEMA);
      } finally {
        await schemaClient.end();
      }
      // A template copies only while nobody is connected to it.
      await client.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()', [building]);
      await client.query(`ALTER DATABASE ${building} RENAME TO ${name}`);
    } finally {
      await client.query('SELECT pg_advisory_unlock($1)', [TEMPLATE_LOCK_KEY]);
    }
  });
  return name;
}

/** A fresh database with Keel's migrations and BullMQ's schema, copied from the template. */
export async function createMigratedDatabase(): Promise<{ name: string; url: string; drop: () => Promise<void> }> {
  const source = await migratedTemplate();
  const name = `keel_test_${randomBytes(6).toString('hex')}`;
  await admin((client) => client.query(`CREATE DATABASE ${name} TEMPLATE ${source}`));
  return {
    name,
    url: databaseUrl(name),
    drop: () => admin((client) => client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)).then(() => undefined),
  };
}

/** A fresh, migrated database with a slonik pool on it. */
export async function createTestDatabase(options: { migrate?: boolean } = {}): Promise<TestDatabase> {
  const database = options.migrate === false ? await createEmptyDatabase() : await createMigratedDatabase();
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
