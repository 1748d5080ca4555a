import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { loadConfig, type KeelConfig } from '../config/load-config.js';
import { readMigrations } from '../db/migrate.js';
import { isConnectionError } from '../db/pool.js';
import { createLogger, type KeelLogger } from '../log/logger.js';
import { openDatabase, unreachableDatabase } from '../runtime/open-database.js';
import type { StartOptions } from '../runtime/start-keel.js';

export type GlobalOptions = { config?: string };

/** Exit codes shared by every command; `keel doctor` uses the specific ones to say what failed. */
export const EXIT = { ok: 0, failure: 1, config: 2, database: 3, queue: 4, masterKey: 5, notFound: 6, usage: 64 } as const;

export class CliExit extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.code = code;
  }
}

export function loadConfigOrExit(options: GlobalOptions): KeelConfig {
  const result = loadConfig({ configPath: options.config });
  if (result.ok) return result.config;
  throw new CliExit(EXIT.config, `invalid configuration:\n${result.problems.map((problem) => `  - ${problem}`).join('\n')}`);
}

export function commandLogger(): KeelLogger {
  // Commands print their results on stdout; logs go to stderr and stay quiet unless asked.
  return createLogger({ level: process.env.KEEL_LOG_LEVEL ?? 'warn' });
}

const migrationRow = z.object({ id: z.number() });

/** Opens the database for a short command and checks the schema is current (never migrates). */
export async function withDatabase<T>(config: KeelConfig, fn: (pool: DatabasePool, logger: KeelLogger, databaseUrl: string) => Promise<T>): Promise<T> {
  const logger = commandLogger();
  const opened = await openDatabase(config, logger, 'command', { maximumPoolSize: 4, applicationName: 'keel-cli' });
  if (!opened.ok) throw new CliExit(EXIT.database, opened.message);
  try {
    return await checkSchema(opened.database.pool, logger, opened.database.url, fn);
  } catch (error) {
    // The server went away after the pool was made.
    if (isConnectionError(error)) throw new CliExit(EXIT.database, unreachableDatabase(error));
    throw error;
  } finally {
    await opened.database.close();
  }
}

/** Refuses a schema behind the migrations, then runs the command. */
async function checkSchema<T>(pool: DatabasePool, logger: KeelLogger, url: string, fn: (pool: DatabasePool, logger: KeelLogger, databaseUrl: string) => Promise<T>): Promise<T> {
  const files = readMigrations();
  if (!files.ok) throw new CliExit(EXIT.database, files.message);
  const tableExists = await pool.oneFirst(sql.type(z.object({ exists: z.boolean() }))`SELECT to_regclass('keel_migrations') IS NOT NULL AS exists`);
  const applied = tableExists ? new Set(await pool.anyFirst(sql.type(migrationRow)`SELECT id FROM keel_migrations`)) : new Set<number>();
  const pending = files.migrations.filter((migration) => !applied.has(migration.id));
  if (pending.length > 0) {
    throw new CliExit(EXIT.database, `the database schema is behind (${pending.length} migration(s) pending, first ${pending[0]!.name}); run \`keel migrate\``);
  }
  return fn(pool, logger, url);
}

export function printTable(rows: ReadonlyArray<Record<string, string>>, columns: readonly string[]): string {
  const widths = columns.map((column) => Math.max(column.length, ...rows.map((row) => (row[column] ?? '').length)));
  const line = (values: readonly string[]) => values.map((value, index) => value.padEnd(widths[index]!)).join('  ').trimEnd();
  return [line(columns.map((column) => column.toUpperCase())), ...rows.map((row) => line(columns.map((column) => row[column] ?? '')))].join('\n');
}

export function formatTime(ms: number | null): string {
  return ms === null ? '-' : new Date(ms).toISOString();
}

/**
 * What only Keel's test harness gives `keel start` (test/support/keel-harness-entry.js calls `main`
 * with it); the `keel` binary calls `main` without it, so no production start can set it.
 */
export type HarnessStartOptions = Pick<StartOptions, 'pushTestTimings'>;
