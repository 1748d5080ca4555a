import { randomBytes } from 'node:crypto';
import pg from 'pg';

// Benchmarks run against the machine's Postgres (and Redis when asked), on a database of their own
// that they drop at the end. They print figures; they assert nothing.

export const ADMIN_URL = process.env.KEEL_BENCH_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

/** A fresh database on the server at `adminUrl` (the machine's by default) for `fn`, dropped afterwards. */
export async function withBenchDatabase<T>(fn: (url: string) => Promise<T>, adminUrl: string = ADMIN_URL): Promise<T> {
  const name = `keel_bench_${randomBytes(5).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  try {
    return await fn(url.toString());
  } finally {
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => undefined);
    await admin.end();
  }
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

export const fmt = (value: number, digits = 1) => value.toFixed(digits);
