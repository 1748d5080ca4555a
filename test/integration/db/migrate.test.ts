import { spawn } from 'node:child_process';
import { appendFileSync, cpSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { MIGRATIONS_DIR, migrate, readMigrations } from '../../../src/db/migrate.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { tempDir } from '../../support/test-keel.js';

// Migrations against a real Postgres: each test takes a fresh empty database of its own.

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
const KEEL_BIN = join(REPO_ROOT, 'bin', 'keel.js');

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
});

async function freshDatabase(): Promise<string> {
  const database = await createEmptyDatabase();
  cleanups.push(database.drop);
  return database.url;
}

function scratchDir(prefix: string): string {
  const dir = tempDir(prefix);
  cleanups.push(async () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A copy of the repository's migrations that a test may edit. */
function copyOfMigrations(): string {
  const dir = join(scratchDir('keel-sql-'), 'sql');
  cpSync(MIGRATIONS_DIR, dir, { recursive: true });
  return dir;
}

async function query<R extends pg.QueryResultRow>(url: string, text: string, values: unknown[] = []): Promise<R[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<R>(text, values)).rows;
  } finally {
    await client.end();
  }
}

async function recorded(url: string): Promise<Array<{ id: number; name: string; checksum: string }>> {
  return query(url, 'SELECT id, name, checksum FROM keel_migrations ORDER BY id');
}

async function tableCount(url: string, table: string): Promise<number> {
  const rows = await query<{ n: number }>(
    url,
    `SELECT count(*)::int AS n FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
     WHERE c.relname = $1 AND c.relkind = 'r' AND s.nspname = 'public'`,
    [table],
  );
  return rows[0]!.n;
}

type CliResult = { code: number | null; stdout: string; stderr: string };

/** Runs `node bin/keel.js <args>` against `databaseUrl`, with no KEEL_* variable of the caller leaking in. */
function runKeel(args: string[], databaseUrl: string): Promise<CliResult> {
  const env: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('KEEL_')));
  Object.assign(env, { KEEL_DATABASE_URL: databaseUrl, KEEL_DATA_DIR: scratchDir('keel-data-'), KEEL_LOG_LEVEL: 'warn' });
  return new Promise((resolvePromise, reject) => {
    const child = spawn(process.execPath, [KEEL_BIN, ...args], { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
    child.on('error', reject);
    child.on('close', (code) => resolvePromise({ code, stdout, stderr }));
  });
}

/**
 * Makes `start`'s migrators provably overlap: keel_migrations is created (by a run over an empty
 * directory) and held under an ACCESS EXCLUSIVE lock, so the first migrator to take the advisory
 * lock blocks on the table while every other one waits on the advisory lock. Only when all
 * `migrators` are seen waiting is the table released.
 */
async function whileMigrationsHeld<T>(url: string, migrators: number, start: () => Promise<T>): Promise<T> {
  const empty = scratchDir('keel-sql-empty-');
  expect(await migrate(url, empty)).toEqual({ ok: true, applied: [], current: 0 });
  const holder = new pg.Client({ connectionString: url });
  await holder.connect();
  try {
    await holder.query('BEGIN');
    await holder.query('LOCK TABLE keel_migrations IN ACCESS EXCLUSIVE MODE');
    const running = start();
    const deadline = Date.now() + 15_000;
    for (;;) {
      const waiting = await query<{ advisory: number; relation: number }>(
        url,
        `SELECT count(*) FILTER (WHERE locktype = 'advisory')::int AS advisory,
                count(*) FILTER (WHERE locktype = 'relation' AND relation = 'keel_migrations'::regclass)::int AS relation
         FROM pg_locks WHERE NOT granted`,
      );
      if (waiting[0]!.relation === 1 && waiting[0]!.advisory === migrators - 1) break;
      if (Date.now() > deadline) throw new Error(`migrators never all waited: ${JSON.stringify(waiting[0])}`);
      await new Promise((resolveWait) => setTimeout(resolveWait, 20));
    }
    await holder.query('COMMIT');
    return await running;
  } finally {
    await holder.end();
  }
}

const shipped = readMigrations();
if (!shipped.ok) throw new Error(shipped.message);
const SHIPPED = shipped.migrations;

describe('migrate', () => {
  it('applies every migration once on an empty database, records each with its checksum, and applies nothing the second time', async () => {
    const url = await freshDatabase();
    const first = await migrate(url);
    expect(first).toEqual({ ok: true, applied: SHIPPED.map((m) => m.name), current: SHIPPED[SHIPPED.length - 1]!.id });
    expect(await recorded(url)).toEqual(SHIPPED.map((m) => ({ id: m.id, name: m.name, checksum: m.checksum })));
    expect(SHIPPED.every((m) => /^[0-9a-f]{64}$/.test(m.checksum))).toBe(true);
    expect(await tableCount(url, 'runs')).toBe(1);
    expect(await tableCount(url, 'run_events')).toBe(1);
    expect(await tableCount(url, 'sealing_keys')).toBe(1);

    const second = await migrate(url);
    expect(second).toEqual({ ok: true, applied: [], current: first.ok ? first.current : -1 });
    expect(await recorded(url)).toHaveLength(SHIPPED.length);
  });

  it('two processes running `keel migrate` at the same moment both succeed and each migration runs exactly once', async () => {
    const url = await freshDatabase();
    const [a, b] = await whileMigrationsHeld(url, 2, () => Promise.all([runKeel(['migrate'], url), runKeel(['migrate'], url)]));
    expect({ code: a.code, stderr: a.stderr }).toEqual({ code: 0, stderr: '' });
    expect({ code: b.code, stderr: b.stderr }).toEqual({ code: 0, stderr: '' });

    // Between them, every migration was applied once: by one process or the other, never by both.
    const appliedLines = [...a.stdout.split('\n'), ...b.stdout.split('\n')].filter((line) => line.startsWith('applied '));
    expect(appliedLines.sort()).toEqual(SHIPPED.map((m) => `applied ${m.name}`).sort());
    expect(await recorded(url)).toEqual(SHIPPED.map((m) => ({ id: m.id, name: m.name, checksum: m.checksum })));
    expect(await tableCount(url, 'runs')).toBe(1);
    expect(await tableCount(url, 'keel_migrations')).toBe(1);
  });

  it('five concurrent migrate() calls in one process apply each migration exactly once', async () => {
    const url = await freshDatabase();
    const results = await whileMigrationsHeld(url, 5, () => Promise.all(Array.from({ length: 5 }, () => migrate(url))));
    const applied: string[] = [];
    for (const result of results) {
      expect(result.ok).toBe(true);
      if (result.ok) applied.push(...result.applied);
    }
    expect(applied.sort()).toEqual(SHIPPED.map((m) => m.name).sort());
    expect(await recorded(url)).toHaveLength(SHIPPED.length);
    expect(await tableCount(url, 'runs')).toBe(1);
  });

  it('refuses a landed migration whose file changed, naming the file, and applies nothing else', async () => {
    const url = await freshDatabase();
    const dir = copyOfMigrations();
    const landed = await migrate(url, dir);
    expect(landed.ok).toBe(true);
    const before = await recorded(url);

    const target = readdirSync(dir).filter((file) => file.endsWith('.sql')).sort()[0]!;
    appendFileSync(join(dir, target), '\n-- an innocent-looking edit\n');
    writeFileSync(join(dir, '9000_after_the_edit.sql'), 'CREATE TABLE must_not_exist (id integer);\n');

    const result = await migrate(url, dir);
    expect(result).toMatchObject({ ok: false, reason: 'changed', name: target });
    expect(result.ok ? '' : result.message).toContain(target);
    expect(await recorded(url)).toEqual(before);
    expect(await tableCount(url, 'must_not_exist')).toBe(0);
  });

  it('`keel migrate` exits 3 and names the migration when a landed checksum does not match', async () => {
    const url = await freshDatabase();
    expect((await migrate(url)).ok).toBe(true);
    const first = SHIPPED[0]!;
    await query(url, `UPDATE keel_migrations SET checksum = repeat('0', 64) WHERE id = $1`, [first.id]);

    const result = await runKeel(['migrate'], url);
    expect(result.code).toBe(3);
    expect(result.stderr).toContain(first.name);
    expect(result.stderr).toMatch(/changed after it was applied/);
    expect(result.stdout).not.toMatch(/applied/);
  });

  it('rolls a failing migration back entirely, does not record it, and stops there', async () => {
    const url = await freshDatabase();
    const dir = copyOfMigrations();
    // Two statements that succeed before one that fails: none of them may survive.
    writeFileSync(
      join(dir, '8000_broken.sql'),
      'CREATE TABLE partial_one (id integer);\nINSERT INTO partial_one VALUES (1);\nCREATE TABLE partial_two (id integer REFERENCES no_such_table (id));\n',
    );
    writeFileSync(join(dir, '8001_after_broken.sql'), 'CREATE TABLE after_broken (id integer);\n');

    const result = await migrate(url, dir);
    expect(result).toMatchObject({ ok: false, reason: 'failed', name: '8000_broken.sql' });
    expect(result.ok ? '' : result.message).toMatch(/8000_broken\.sql failed: .*no_such_table/);
    expect(await tableCount(url, 'partial_one')).toBe(0);
    expect(await tableCount(url, 'partial_two')).toBe(0);
    expect(await tableCount(url, 'after_broken')).toBe(0);
    // The migrations before it landed in their own transactions and stay.
    expect((await recorded(url)).map((row) => row.name)).toEqual(SHIPPED.map((m) => m.name));

    // Fixed, the broken one and the one after it apply on the next run.
    writeFileSync(join(dir, '8000_broken.sql'), 'CREATE TABLE partial_one (id integer);\n');
    expect(await migrate(url, dir)).toMatchObject({ ok: true, applied: ['8000_broken.sql', '8001_after_broken.sql'], current: 8001 });
    expect(await tableCount(url, 'after_broken')).toBe(1);
  });

  it('refuses a badly named migration file with invalid_file before touching the database', async () => {
    const url = await freshDatabase();
    for (const bad of ['42_short.sql', '0002-Dashed.sql', '0002_UPPER.sql']) {
      const dir = copyOfMigrations();
      writeFileSync(join(dir, bad), 'CREATE TABLE never (id integer);\n');
      const result = await migrate(url, dir);
      expect(result).toMatchObject({ ok: false, reason: 'invalid_file' });
      expect(result.ok ? '' : result.message).toContain(bad);
    }
    // Two files with one number are refused too.
    const dir = copyOfMigrations();
    writeFileSync(join(dir, `${String(SHIPPED[0]!.id).padStart(4, '0')}_twin.sql`), 'SELECT 1;\n');
    expect(await migrate(url, dir)).toMatchObject({ ok: false, reason: 'invalid_file' });

    expect(await tableCount(url, 'keel_migrations')).toBe(0);
    expect(await tableCount(url, 'never')).toBe(0);
  });
});
