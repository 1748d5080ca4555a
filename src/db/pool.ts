import {
  BackendTerminatedError,
  BackendTerminatedUnexpectedlyError,
  ConnectionError,
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
import { withDeadline, type Probe } from '../health/probe.js';
import { createCrashSafeDriverFactory } from './crash-safe-driver.js';
import { DEFAULT_LINK_TIMEOUT_SECONDS, silentLinkUrl } from './silent-link.js';
import { withOwnTransactions } from './transaction.js';

export type { DatabasePool };

/** `linkTimeoutSeconds`: `database.linkTimeoutSeconds` (silent-link.ts), by default 20. */
export type PoolOptions = { maximumPoolSize?: number; applicationName?: string; linkTimeoutSeconds?: number };

/**
 * The one slonik pool of a Keel process. Connections are not reset with DISCARD ALL on release:
 * Keel keeps no session state outside the routines that take a dedicated connection (advisory
 * locks, LISTEN), and the extra round trip per checkout is measurable on the hot path. Its
 * transactions are Keel's own (transaction.ts): slonik's would turn on promise hooks process-wide.
 */
export async function createDatabasePool(url: string, options: PoolOptions = {}): Promise<DatabasePool> {
  const withName = new URL(url);
  if (options.applicationName && !withName.searchParams.has('application_name')) {
    withName.searchParams.set('application_name', options.applicationName);
  }
  // The server ends the session of a client whose link went silent within the link timeout, so
  // the locks of a transaction it had open do not hold up the other processes (silent-link.ts).
  const sessionUrl = silentLinkUrl(withName.toString(), options.linkTimeoutSeconds ?? DEFAULT_LINK_TIMEOUT_SECONDS);
  const pool = await createPool(sessionUrl, {
    driverFactory: createCrashSafeDriverFactory(),
    maximumPoolSize: options.maximumPoolSize ?? 20,
    idleTimeout: 30_000,
    statementTimeout: 60_000,
    connectionTimeout: 10_000,
    resetConnection: async () => undefined,
    // Slonik retries a statement refused with a class 40 error only when it is outside one of its
    // own transactions, which it tells by state Keel's transactions (transaction.ts) do not set:
    // inside one, the retry would run in an aborted transaction and hide the refusal. A refused
    // transaction is retried whole by transaction.ts; a single statement's refusal goes to its caller.
    queryRetryLimit: 0,
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
  return withOwnTransactions(pool);
}

/**
 * A readiness probe that answers within `timeoutMs` whatever the database does: a server in crash
 * recovery refuses connections at once, but a checkout can also wait behind a full pool or a
 * half-open socket, and /readyz must still answer and say why.
 */
export async function probeDatabase(pool: DatabasePool, timeoutMs: number): Promise<Probe> {
  return withDeadline(timeoutMs, `no answer from the database within ${timeoutMs} ms`, async () => {
    await pool.oneFirst(sql.type(z.object({ ok: z.number() }))`SELECT 1 AS ok`);
  });
}

/** SQLSTATEs of a lost or refused connection: class 08, and the server shutting down or starting up. */
const CONNECTION_STATES = /^(08...|57P0[1-3])$/;
const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH']);

/**
 * Whether an error (or its cause) means the database could not be reached: a transient condition a
 * retry outlives, unlike a query the database refused. Work that hits it is left to its lease and
 * the reaper, never settled as failed.
 */
export function isConnectionError(error: unknown): boolean {
  for (let current = error, depth = 0; current instanceof Error && depth < 5; current = (current as { cause?: unknown }).cause, depth += 1) {
    if (current instanceof BackendTerminatedError || current instanceof BackendTerminatedUnexpectedlyError || current instanceof ConnectionError) return true;
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' && (CONNECTION_STATES.test(code) || CONNECTION_CODES.has(code))) return true;
    if (/Connection terminated/i.test(current.message)) return true;
  }
  return false;
}
