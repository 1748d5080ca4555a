import pg from 'pg';
import { DEFAULT_SCHEMA, quoteSchemaName, type PgPool, type PgPoolClient, type PgQueryResult } from 'bullmq';
import { clientKeepAlive, DEFAULT_LINK_TIMEOUT_SECONDS, silentLinkUrl } from '../db/silent-link.js';
import type { BullmqSchema } from './bullmq-schema.js';

/**
 * A `pg.Pool` that Keel hands to BullMQ's Postgres backend as a connection, with BullMQ's schema
 * migrated before its first use (`BullmqSchema`).
 *
 * Given a connection string, BullMQ builds a pool of up to five connections for each queue and
 * each worker, plus a standalone LISTEN connection per worker: one Keel process held 20 queue
 * connections at rest and up to 55. Keel gives all its queues (the producers) one pool and each worker one of its own
 * (`KeelQueues`); BullMQ checks a worker's LISTEN client out of the worker's pool and runs every
 * query through the pool it was given, but does not migrate it.
 */
export class QueuePool implements PgPool {
  private readonly pool: pg.Pool;
  /** Set once the schema is migrated, so BullMQ's queries after that do not wait on it. */
  private schemaReady = false;

  constructor(
    connectionString: string,
    size: number,
    private readonly schema: BullmqSchema,
    linkTimeoutSeconds: number = DEFAULT_LINK_TIMEOUT_SECONDS,
  ) {
    this.pool = new pg.Pool({
      // BullMQ's SQL names its tables without a schema, as on the pools it builds itself; and the
      // server ends a session whose client went silent within the link timeout (silent-link.ts).
      // In the URL, where they join the URL's own options (a config's `options` would be replaced by them).
      connectionString: silentLinkUrl(connectionString, linkTimeoutSeconds, { search_path: quoteSchemaName(DEFAULT_SCHEMA) }),
      application_name: 'keel-queues',
      max: size,
      // A silent server is noticed on a connection that waits for it (BullMQ's LISTEN, checked out
      // of this pool): an error within half the link timeout and ten probes, and BullMQ rebuilds it.
      ...clientKeepAlive(linkTimeoutSeconds),
    });
    // Every BullMQ queue and worker adds an error listener to the pool it is given, and reports
    // an idle connection's error (Postgres restarted) as its own. Until the first one is made, an
    // unheard 'error' would end the process; the pool drops that connection by itself.
    this.pool.setMaxListeners(0);
    this.pool.on('error', ignoreIdleError);
  }

  /** BullMQ reads `keepAlive` here to know whether a silent drop of its LISTEN client is noticed. */
  get options(): pg.PoolConfig {
    return (this.pool as unknown as { options: pg.PoolConfig }).options;
  }

  async connect(): Promise<PgPoolClient> {
    if (!this.schemaReady) await this.ensureSchema();
    return this.pool.connect();
  }

  async query<R = unknown>(text: string, params?: readonly unknown[]): Promise<PgQueryResult<R>> {
    if (!this.schemaReady) await this.ensureSchema();
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
    if (event === undefined || event === 'error') this.pool.on('error', ignoreIdleError);
    return this;
  }

  private async ensureSchema(): Promise<void> {
    await this.schema.ensure(() => this.pool.connect());
    this.schemaReady = true;
  }

  /** Ends every connection; called once, after every queue and worker using the pool is closed. */
  async end(): Promise<void> {
    await this.pool.end();
  }
}

/** The pool drops an idle connection that errs by itself; BullMQ's own listeners report it. */
function ignoreIdleError(): void {}
