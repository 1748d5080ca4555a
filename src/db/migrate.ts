import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

export const MIGRATIONS_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '../../sql');
// pg_advisory_lock key shared by every Keel process migrating the same database.
const MIGRATION_LOCK_KEY = 4_242_000_001;

export type Migration = { id: number; name: string; checksum: string; text: string };

export type MigrateResult =
  | { ok: true; applied: string[]; current: number }
  | { ok: false; reason: 'changed'; name: string; message: string }
  | { ok: false; reason: 'invalid_file'; message: string }
  | { ok: false; reason: 'failed'; name: string; message: string };

const FILE_PATTERN = /^(\d{4})_([a-z0-9_]+)\.sql$/;

export function readMigrations(dir = MIGRATIONS_DIR): { ok: true; migrations: Migration[] } | { ok: false; message: string } {
  const migrations: Migration[] = [];
  for (const file of readdirSync(dir).sort()) {
    if (!file.endsWith('.sql')) continue;
    const match = FILE_PATTERN.exec(file);
    if (!match) return { ok: false, message: `migration file ${file}: expected a name like 0001_create_runs.sql` };
    const text = readFileSync(join(dir, file), 'utf8');
    migrations.push({
      id: Number(match[1]),
      name: file,
      text,
      checksum: createHash('sha256').update(text).digest('hex'),
    });
  }
  const ids = migrations.map((migration) => migration.id);
  const duplicate = ids.find((id, index) => ids.indexOf(id) !== index);
  if (duplicate !== undefined) return { ok: false, message: `two migration files share the number ${String(duplicate).padStart(4, '0')}` };
  return { ok: true, migrations };
}

/**
 * Applies pending migrations, each in its own transaction. Concurrent callers (two processes
 * starting at once) queue on a session advisory lock, so each migration runs once. A landed
 * migration whose file has changed since is refused: migrations are never edited once applied.
 *
 * Migration files are whole SQL scripts (several statements, dollar-quoted bodies), which slonik
 * refuses by design; they run on one dedicated `pg` client over the simple query protocol instead.
 */
export async function migrate(databaseUrl: string, dir = MIGRATIONS_DIR): Promise<MigrateResult> {
  const files = readMigrations(dir);
  if (!files.ok) return { ok: false, reason: 'invalid_file', message: files.message };

  const client = new pg.Client({ connectionString: databaseUrl, application_name: 'keel-migrate' });
  await client.connect();
  try {
    await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
    await client.query(`
      CREATE TABLE IF NOT EXISTS keel_migrations (
        id integer PRIMARY KEY,
        name text NOT NULL,
        checksum text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
      )`);
    const applied = await client.query<{ id: number; name: string; checksum: string }>('SELECT id, name, checksum FROM keel_migrations ORDER BY id');
    const byId = new Map(applied.rows.map((row) => [row.id, row]));
    for (const migration of files.migrations) {
      const landed = byId.get(migration.id);
      if (landed && landed.checksum !== migration.checksum) {
        return {
          ok: false,
          reason: 'changed',
          name: migration.name,
          message: `migration ${migration.name} was changed after it was applied (checksum ${landed.checksum.slice(0, 12)} in the database, ${migration.checksum.slice(0, 12)} on disk); landed migrations are never edited, add a new one instead`,
        };
      }
    }
    const done: string[] = [];
    for (const migration of files.migrations) {
      if (byId.has(migration.id)) continue;
      try {
        await client.query('BEGIN');
        await client.query(migration.text);
        await client.query('INSERT INTO keel_migrations (id, name, checksum) VALUES ($1, $2, $3)', [migration.id, migration.name, migration.checksum]);
        await client.query('COMMIT');
      } catch (error) {
        await client.query('ROLLBACK').catch(() => undefined);
        return { ok: false, reason: 'failed', name: migration.name, message: `migration ${migration.name} failed: ${(error as Error).message}` };
      }
      done.push(migration.name);
    }
    const current = files.migrations.length ? files.migrations[files.migrations.length - 1]!.id : 0;
    return { ok: true, applied: done, current };
  } finally {
    await client.query('SELECT pg_advisory_unlock_all()').catch(() => undefined);
    await client.end().catch(() => undefined);
  }
}
