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
 *
 * What slonik has no word for: whatever a handler takes from memory for its writes (a run's
 * buffered audit events) it gives back when its level is undone, so a retry, or the caller of a
 * savepoint that failed, finds it again. `onRollback(connection, giveBack)` registers the giving
 * back with the level `connection` belongs to. When that level is undone (ROLLBACK, ROLLBACK TO
 * SAVEPOINT, a failed COMMIT) the registered functions run, last registered first, before the
 * error goes on or the handler runs again. A savepoint that is kept hands its list to the level
 * around it (the outer transaction may still roll back); a COMMIT drops the list. A level keeps
 * no list until something registers: a transaction that takes nothing allocates nothing for it.
 */

/** slonik's default transactionRetryLimit. */
export const TRANSACTION_RETRY_LIMIT = 5;

/** Class 40, transaction rollback: the server refused the transaction as a whole, and a retry may pass. */
const ROLLBACK_CLASS = '40';

type Handler<T> = (transaction: CommonQueryMethods) => Promise<T>;

/** What gives back what a level took, on the connection object its handler receives. */
const GIVE_BACKS = Symbol('keel.transaction.giveBacks');

/** One level's registered give-backs (null until one is registered). */
type Undoable = { [GIVE_BACKS]: Array<() => void> | null };

/**
 * Registers `giveBack` to run if the level `connection` belongs to (a transaction or a savepoint
 * of this module) is undone, including before a retry. False when `connection` is no such level
 * (the pool itself: each statement commits or fails on its own, and the caller knows which).
 */
export function onRollback(connection: CommonQueryMethods, giveBack: () => void): boolean {
  if (!(GIVE_BACKS in connection)) return false;
  const level = connection as CommonQueryMethods & Undoable;
  (level[GIVE_BACKS] ??= []).push(giveBack);
  return true;
}

/** Runs a level's give-backs, last registered first; one that throws does not keep the others from running. */
function giveBackAll(giveBacks: Array<() => void> | null): void {
  if (giveBacks === null) return;
  for (let index = giveBacks.length - 1; index >= 0; index -= 1) {
    try {
      giveBacks[index]!();
    } catch {
      // A give-back is a memory operation of its owner; the error to report is the level's own.
    }
  }
}

/** `pool` with `transaction()` replaced by this module's; every other method is the pool's own. */
export function withOwnTransactions(pool: DatabasePool): DatabasePool {
  const own: DatabasePool = Object.create(pool, {
    transaction: {
      value: <T>(handler: Handler<T>, retryLimit?: number) =>
        pool.connect((connection) => attempt(connection, TRANSACTION, 0, null, handler, retryLimit ?? TRANSACTION_RETRY_LIMIT)),
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
 * `transaction()` opening a savepoint one level down, and the level's give-backs (onRollback).
 */
function atDepth(connection: CommonQueryMethods, depth: number): CommonQueryMethods & Undoable {
  const level = Object.create(connection, {
    transaction: {
      value: <T>(handler: Handler<T>, retryLimit?: number) =>
        attempt(connection, savepoint(depth + 1), depth + 1, level, handler, retryLimit ?? TRANSACTION_RETRY_LIMIT),
    },
    [GIVE_BACKS]: { value: null, writable: true },
  }) as CommonQueryMethods & Undoable;
  return level;
}

/** How one level opens, keeps and undoes its work: the transaction itself, or a savepoint in it. */
type Level = { open: SqlText; keep: SqlText; undo: SqlText };
type SqlText = ReturnType<typeof sql.unsafe>;

const TRANSACTION: Level = { open: sql.unsafe`BEGIN`, keep: sql.unsafe`COMMIT`, undo: sql.unsafe`ROLLBACK` };

function savepoint(depth: number): Level {
  const name = sql.identifier([`keel_savepoint_${depth}`]);
  return { open: sql.unsafe`SAVEPOINT ${name}`, keep: sql.unsafe`RELEASE SAVEPOINT ${name}`, undo: sql.unsafe`ROLLBACK TO SAVEPOINT ${name}` };
}

/**
 * Runs the handler inside one level (the handler's own `transaction()` goes one level down), rerun
 * whole on a class 40 refusal. `outer`: the level around a savepoint (null for the transaction),
 * which takes over the savepoint's give-backs when it is kept.
 */
async function attempt<T>(connection: CommonQueryMethods, level: Level, depth: number, outer: Undoable | null, handler: Handler<T>, retryLimit: number): Promise<T> {
  for (let retriesLeft = retryLimit; ; retriesLeft -= 1) {
    await connection.query(level.open);
    const inside = atDepth(connection, depth);
    try {
      const result = await handler(inside);
      await connection.query(level.keep);
      const kept = inside[GIVE_BACKS];
      if (outer !== null && kept !== null) (outer[GIVE_BACKS] ??= []).push(...kept);
      return result;
    } catch (error) {
      // A failed COMMIT has ended the transaction already (ROLLBACK then only warns), and a lost
      // connection refuses the undo: either way the error to report is the first one. Whether a
      // COMMIT that lost its connection was kept is unknown: what was taken is given back all the
      // same (an audit row stored twice is skipped by its key).
      await connection.query(level.undo).catch(() => undefined);
      giveBackAll(inside[GIVE_BACKS]);
      if (retriesLeft <= 0 || !isRetryable(error)) throw error;
    }
  }
}
