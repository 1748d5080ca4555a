import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';

/**
 * Transactions for Keel's pool, written with BEGIN/COMMIT on a pooled connection instead of slonik's
 * `transaction()` (docs/decisions/0041-transactions-without-async-local-storage.md).
 *
 * Why: slonik 47 runs each transaction inside an AsyncLocalStorage, and on Node 20 the first
 * `run()` turns on promise hooks for the whole process for good: from then on every promise any
 * code creates pays an init hook and carries a context. On the hot path that is about 5 % of
 * Keel's CPU. Slonik uses the storage only to refuse a query on another pool connection while a
 * transaction is open (UnexpectedForeignConnectionError); Keel never does that.
 *
 * The same contract as slonik's: the handler's queries run on one connection between BEGIN and
 * COMMIT; when the handler or the COMMIT throws, the transaction is rolled back and the error goes
 * to the caller (slonik's pool then destroys the connection). A transaction refused with a class 40
 * error (serialization failure, deadlock) is run again, at most `retryLimit` more times, on the
 * same connection. A `transaction()` called inside is a savepoint, as slonik's nested one is.
 */

/** slonik's default transactionRetryLimit. */
export const TRANSACTION_RETRY_LIMIT = 5;

/** Class 40, transaction rollback: the server refused the transaction as a whole, and a retry may pass. */
const ROLLBACK_CLASS = '40';

type Handler<T> = (transaction: CommonQueryMethods) => Promise<T>;

/** `pool` with `transaction()` replaced by this module's; every other method is the pool's own. */
export function withOwnTransactions(pool: DatabasePool): DatabasePool {
  const own: DatabasePool = Object.create(pool, {
    transaction: {
      value: <T>(handler: Handler<T>, retryLimit?: number) =>
        pool.connect((connection) => attempt(connection, TRANSACTION, 0, handler, retryLimit ?? TRANSACTION_RETRY_LIMIT)),
    },
  });
  return own;
}

function isRetryable(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith(ROLLBACK_CLASS);
}

/**
 * The connection as the handler sees it: the pooled connection's own methods (looked up through
 * the prototype, so a connection slonik has released refuses queries as it does today), with
 * `transaction()` opening a savepoint one level down.
 */
function atDepth(connection: CommonQueryMethods, depth: number): CommonQueryMethods {
  return Object.create(connection, {
    transaction: {
      value: <T>(handler: Handler<T>, retryLimit?: number) =>
        attempt(connection, savepoint(depth + 1), depth + 1, handler, retryLimit ?? TRANSACTION_RETRY_LIMIT),
    },
  }) as CommonQueryMethods;
}

/** How one level opens, keeps and undoes its work: the transaction itself, or a savepoint in it. */
type Level = { open: SqlText; keep: SqlText; undo: SqlText };
type SqlText = ReturnType<typeof sql.unsafe>;

const TRANSACTION: Level = { open: sql.unsafe`BEGIN`, keep: sql.unsafe`COMMIT`, undo: sql.unsafe`ROLLBACK` };

function savepoint(depth: number): Level {
  const name = sql.identifier([`keel_savepoint_${depth}`]);
  return { open: sql.unsafe`SAVEPOINT ${name}`, keep: sql.unsafe`RELEASE SAVEPOINT ${name}`, undo: sql.unsafe`ROLLBACK TO SAVEPOINT ${name}` };
}

/** Runs the handler inside one level (the handler's own `transaction()` goes one level down), rerun whole on a class 40 refusal. */
async function attempt<T>(connection: CommonQueryMethods, level: Level, depth: number, handler: Handler<T>, retryLimit: number): Promise<T> {
  for (let retriesLeft = retryLimit; ; retriesLeft -= 1) {
    await connection.query(level.open);
    try {
      const result = await handler(atDepth(connection, depth));
      await connection.query(level.keep);
      return result;
    } catch (error) {
      // A failed COMMIT has ended the transaction already (ROLLBACK then only warns), and a lost
      // connection refuses the undo: either way the error to report is the first one.
      await connection.query(level.undo).catch(() => undefined);
      if (retriesLeft <= 0 || !isRetryable(error)) throw error;
    }
  }
}
