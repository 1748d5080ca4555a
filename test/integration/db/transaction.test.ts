import { createRequire } from 'node:module';
import type { AsyncLocalStorage } from 'node:async_hooks';
import { sql, UniqueIntegrityConstraintViolationError, type CommonQueryMethods } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { onRollback, TRANSACTION_RETRY_LIMIT } from '../../../src/db/transaction.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// Keel's pool runs transactions with BEGIN/COMMIT on a pooled connection, not through slonik's
// transaction(), whose AsyncLocalStorage turns on promise hooks for the whole process (decision
// 0041). What a caller sees must not change: commit, rollback, savepoints, retry of a refused
// transaction, and the rows each leaves.

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ migrate: false });
  await db.pool.query(sql.unsafe`CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)`);
  await db.pool.query(sql.unsafe`CREATE TABLE pair (id int PRIMARY KEY, n int NOT NULL)`);
  await db.pool.query(sql.unsafe`INSERT INTO pair VALUES (1, 0), (2, 0)`);
});
afterAll(async () => db?.drop());

/** A promise and its resolve (Node 20 has no Promise.withResolvers). */
function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((done) => (resolve = done));
  return { promise, resolve };
}

const noteIds = () => db.pool.anyFirst(sql.type(z.object({ id: z.number() }))`SELECT id FROM notes ORDER BY id`);
/** In a transaction block now() is the block's start, earlier than a later statement's own start. */
const blockStartedEarlier = (transaction: CommonQueryMethods) =>
  transaction.oneFirst(sql.type(z.object({ earlier: z.boolean() }))`SELECT now() < statement_timestamp() AS earlier`);

describe("the pool's transaction()", () => {
  it('commits what the handler wrote, in one transaction block, and returns what it returned', async () => {
    const result = await db.pool.transaction(async (transaction) => {
      await transaction.query(sql.unsafe`INSERT INTO notes VALUES (1, 'one')`);
      await new Promise((resolve) => setTimeout(resolve, 20));
      expect(await blockStartedEarlier(transaction), 'the statements share one transaction block').toBe(true);
      return 'kept';
    });
    expect(result).toBe('kept');
    expect(await noteIds()).toEqual([1]);
  });

  it('rolls back every write when the handler throws, and hands the error to the caller as it is', async () => {
    const refusal = new Error('the handler refuses');
    await expect(
      db.pool.transaction(async (transaction) => {
        await transaction.query(sql.unsafe`INSERT INTO notes VALUES (2, 'two')`);
        throw refusal;
      }),
    ).rejects.toBe(refusal);
    expect(await noteIds()).toEqual([1]);
  });

  it('rolls back when a statement is refused, with the refusal as the error (a unique violation here)', async () => {
    await expect(
      db.pool.transaction(async (transaction) => {
        await transaction.query(sql.unsafe`INSERT INTO notes VALUES (3, 'three')`);
        await transaction.query(sql.unsafe`INSERT INTO notes VALUES (1, 'again')`);
      }),
    ).rejects.toBeInstanceOf(UniqueIntegrityConstraintViolationError);
    expect(await noteIds()).toEqual([1]);
    // The pool is still usable afterwards.
    expect(await db.pool.oneFirst(sql.type(z.object({ ok: z.number() }))`SELECT 1 AS ok`)).toBe(1);
  });

  it('makes a transaction() inside a savepoint: its failure undoes only its own writes', async () => {
    await db.pool.transaction(async (transaction) => {
      await transaction.query(sql.unsafe`INSERT INTO notes VALUES (4, 'outer')`);
      await expect(
        transaction.transaction(async (nested) => {
          await nested.query(sql.unsafe`INSERT INTO notes VALUES (5, 'inner')`);
          await nested.query(sql.unsafe`INSERT INTO notes VALUES (4, 'clash')`);
        }),
      ).rejects.toBeInstanceOf(UniqueIntegrityConstraintViolationError);
      await transaction.transaction(async (nested) => {
        await nested.query(sql.unsafe`INSERT INTO notes VALUES (6, 'inner kept')`);
        await nested.transaction((deeper) => deeper.query(sql.unsafe`INSERT INTO notes VALUES (7, 'two levels down')`));
      });
    });
    expect(await noteIds()).toEqual([1, 4, 6, 7]);
  });

  it('runs a transaction the server refused with a deadlock again, and the retry commits', async () => {
    // Two transactions lock the pair's rows in opposite orders; Postgres breaks the deadlock by
    // refusing one (40P01). That one is run again from BEGIN and commits on its next attempt.
    // Each first attempt holds its first row before either asks for its second (a barrier, not a
    // pause, so a slow machine cannot let one finish alone), and a retry locks in the other's
    // order, so it queues behind the one still running. (In ascending order it could deadlock a
    // second time: the retry may update the row its refused attempt released before the waiting
    // transaction, woken by the rollback, takes it, and then wait for the other's row.) Only the
    // first looks for the deadlock soon (deadlock_timeout): when both backends' checks overlap,
    // Postgres can refuse both (a clean-clone CI run saw four attempts), so the second's check is
    // put off beyond the test and the first is the one refused.
    const attempts = { first: 0, second: 0 };
    const deadlockCheck = { first: sql.unsafe`SET LOCAL deadlock_timeout = '50ms'`, second: sql.unsafe`SET LOCAL deadlock_timeout = '60s'` };
    const firstRowHeld = { first: deferred(), second: deferred() };
    const lockInOrder = (which: keyof typeof attempts, other: keyof typeof attempts, [a, b]: [number, number]) =>
      db.pool.transaction(async (transaction) => {
        attempts[which] += 1;
        await transaction.query(deadlockCheck[which]);
        const [one, two] = attempts[which] === 1 ? [a, b] : [b, a];
        await transaction.query(sql.unsafe`UPDATE pair SET n = n + 1 WHERE id = ${one}`);
        if (attempts[which] === 1) {
          firstRowHeld[which].resolve();
          await firstRowHeld[other].promise;
        }
        await transaction.query(sql.unsafe`UPDATE pair SET n = n + 1 WHERE id = ${two}`);
      });
    await Promise.all([lockInOrder('first', 'second', [1, 2]), lockInOrder('second', 'first', [2, 1])]);
    expect(attempts.first + attempts.second, 'one of the two ran twice').toBe(3);
    const counts = await db.pool.anyFirst(sql.type(z.object({ n: z.number() }))`SELECT n FROM pair ORDER BY id`);
    expect(counts, 'each committed once: the refused attempt left nothing').toEqual([2, 2]);
  });

  it(`gives up after ${TRANSACTION_RETRY_LIMIT} retries and hands over the server's refusal`, async () => {
    let attempts = 0;
    await expect(
      db.pool.transaction(async (transaction) => {
        attempts += 1;
        await transaction.query(sql.unsafe`DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'serialization_failure'; END $$`);
      }),
    ).rejects.toMatchObject({ code: '40001' });
    expect(attempts).toBe(TRANSACTION_RETRY_LIMIT + 1);
  });

  it('gives back what a handler took when its transaction rolls back: last taken first, before the retry, never on a commit', async () => {
    // The memory a handler takes from (a run's buffered audit events) and what it gives back.
    const given: string[] = [];
    let attempts = 0;
    await db.pool.transaction(async (transaction) => {
      attempts += 1;
      expect(given, 'the first attempt gave back before the retry began').toEqual(attempts === 1 ? [] : ['second', 'first']);
      expect(onRollback(transaction, () => given.push('first'))).toBe(true);
      expect(onRollback(transaction, () => given.push('second'))).toBe(true);
      if (attempts === 1) await transaction.query(sql.unsafe`DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'serialization_failure'; END $$`);
    });
    expect(attempts).toBe(2);
    expect(given, 'the committed attempt gave nothing back').toEqual(['second', 'first']);

    const refusal = new Error('the handler refuses');
    const undone: string[] = [];
    await expect(
      db.pool.transaction(async (transaction) => {
        onRollback(transaction, () => undone.push('taken'));
        throw refusal;
      }),
    ).rejects.toBe(refusal);
    expect(undone).toEqual(['taken']);
    // The pool is no transaction: a statement there commits or fails alone.
    expect(onRollback(db.pool, () => undone.push('never'))).toBe(false);
  });

  it('gives back at the savepoint that is undone; a savepoint kept gives back with the transaction around it', async () => {
    const given: string[] = [];
    await db.pool.transaction(async (transaction) => {
      onRollback(transaction, () => given.push('outer'));
      await transaction
        .transaction(async (nested) => {
          onRollback(nested, () => given.push('undone savepoint'));
          throw new Error('undo the savepoint');
        })
        .catch(() => undefined);
      expect(given, 'only the undone savepoint gave back').toEqual(['undone savepoint']);
      await transaction.transaction(async (nested) => {
        onRollback(nested, () => given.push('kept savepoint'));
        await nested.transaction(async (deeper) => {
          onRollback(deeper, () => given.push('kept two levels down'));
        });
      });
    });
    expect(given, 'the transaction committed: nothing more given back').toEqual(['undone savepoint']);

    given.length = 0;
    await expect(
      db.pool.transaction(async (transaction) => {
        onRollback(transaction, () => given.push('outer'));
        await transaction.transaction(async (nested) => {
          onRollback(nested, () => given.push('kept savepoint'));
          await nested.transaction(async (deeper) => {
            onRollback(deeper, () => given.push('kept two levels down'));
          });
        });
        onRollback(transaction, () => given.push('outer, after'));
        throw new Error('undo the transaction');
      }),
    ).rejects.toThrow('undo the transaction');
    expect(given, 'the transaction rolled back: every level it kept gives back, last taken first').toEqual(['outer, after', 'kept two levels down', 'kept savepoint', 'outer']);
  });

  it("never enters slonik's transaction context, so no AsyncLocalStorage is turned on", async () => {
    // slonik keeps its transaction context in this module; its run() is what turns promise hooks on.
    const require = createRequire(import.meta.url);
    const { transactionContext } = require('slonik/dist/contexts/transactionContext.js') as { transactionContext: AsyncLocalStorage<unknown> };
    const seen = await db.pool.transaction(async (transaction) => {
      await transaction.query(sql.unsafe`SELECT 1`);
      return transactionContext.getStore();
    });
    expect(seen).toBeUndefined();
  });
});
