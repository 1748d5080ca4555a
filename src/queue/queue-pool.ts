import pg from 'pg';
import { DEFAULT_SCHEMA, quoteSchemaName, runMigrations, type PgPool, type PgPoolClient, type PgQueryResult } from 'bullmq';
import { QUEUE_NAMES } from './queue-names.js';

/**
 * Connections for queries, on top of the one each worker keeps checked out for LISTEN. BullMQ's
 * queries are short (take a job, extend locks, finish it, add one), but every queue and worker of
 * the process now waits for the same slots: with five, a worker process of the fault suite (run
 * leases of 2 s, a sweep every 0.5 s) queued up to six queries and fell behind when the machine
 * was loaded; with ten it kept pace, as fast as when each queue and worker had its own pool.
 */
const QUERY_CONNECTIONS = 10;

/** The most connections a process's queues and workers hold on the Postgres backend. */
export const QUEUE_POOL_SIZE = QUEUE_NAMES.length + QUERY_CONNECTIONS;

/**
 * The one `pg.Pool` that every BullMQ queue and worker of a process shares on the Postgres
 * backend, with BullMQ's schema migrated once before its first use.
 *
 * Given a connection string, BullMQ builds a pool of up to five connections for each queue and
 * each worker, plus a LISTEN connection per worker: one Keel process held 22 connections at rest
 * and 25 under load (up to 55), so four processes filled Postgres's default 100. Given a pool,
 * it checks each worker's LISTEN client out of it and runs every query through it, but no longer
 * migrates; this class does that on the first `connect` or `query`, so a CLI command or
 * `keel doctor` on a fresh database behaves as `keel start` does.
 */
export class QueuePool implements PgPool {
  private readonly pool: pg.Pool;
  private migrated: Promise<void> | undefined;

  constructor(connectionString: string) {
    this.pool = new pg.Pool({
      connectionString,
      application_name: 'keel-queues',
      // Each worker keeps one client for LISTEN; the rest serve every queue's and worker's queries.
      max: QUEUE_POOL_SIZE,
      // BullMQ's SQL names its tables without a schema, as on the pools it builds itself.
      options: `-c search_path=${quoteSchemaName(DEFAULT_SCHEMA)}`,
      // A dropped LISTEN connection then surfaces as an error within seconds, and BullMQ rebuilds it.
      keepAlive: true,
    });
    // Every BullMQ queue and worker adds an error listener to the pool it is given, and reports
    // an idle connection's error (Postgres restarted) as its own. Until the first one is made, an
    // unheard 'error' would end the process; the pool drops that connection by itself.
    this.pool.setMaxListeners(0);
    this.pool.on('error', () => undefined);
  }

  /** BullMQ reads `keepAlive` here to know whether a silent drop of its LISTEN client is noticed. */
  get options(): pg.PoolConfig {
    return (this.pool as unknown as { options: pg.PoolConfig }).options;
  }

  async connect(): Promise<PgPoolClient> {
    await this.migrate();
    return this.pool.connect();
  }

  async query<R = unknown>(text: string, params?: readonly unknown[]): Promise<PgQueryResult<R>> {
    await this.migrate();
    return this.pool.query(text, params as unknown[] | undefined) as unknown as Promise<PgQueryResult<R>>;
  }

  on(event: 'error', listener: (error: Error) => void): this;
  on(event: 'connect', listener: (client: PgPoolClient) => void): this;
  on(event: 'error' | 'connect', listener: ((error: Error) => void) | ((client: PgPoolClient) => void)): this {
    this.pool.on(event, listener as never);
    return this;
  }

  removeAllListeners(event?: string): this {
    this.pool.removeAllListeners(event);
    return this;
  }

  /** Ends every connection; called once, after every queue and worker using the pool is closed. */
  async end(): Promise<void> {
    await this.pool.end();
  }

  /** Migrates once per process; a failed attempt (Postgres down) is tried again on the next use. */
  private migrate(): Promise<void> {
    if (!this.migrated) {
      const attempt = this.runMigrations();
      this.migrated = attempt;
      attempt.catch(() => {
        if (this.migrated === attempt) this.migrated = undefined;
      });
    }
    return this.migrated;
  }

  private async runMigrations(): Promise<void> {
    const client = await this.pool.connect();
    let broken = false;
    try {
      await runMigrations(client, DEFAULT_SCHEMA);
    } catch (error) {
      broken = true;
      throw error;
    } finally {
      client.release(broken);
    }
  }
}
