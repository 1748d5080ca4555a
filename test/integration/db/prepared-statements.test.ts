import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { namedIfPrepared, PREPARED } from '../../../src/db/prepared-statements.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// The hot path's constant statements are prepared once per connection (decision 0030): the pool's
// driver gives node-postgres a name for a text opening with PREPARED, and Postgres keeps the
// statement (and its plan) for the session. Nothing else is prepared.

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => db?.drop());

const prepared = z.object({ name: z.string(), statement: z.string(), from_sql: z.boolean() });
const sessionStatements = sql.type(prepared)`SELECT name, statement, from_sql FROM pg_prepared_statements ORDER BY name`;

describe('a statement opening with PREPARED', () => {
  it('is prepared once on its connection under a name derived from its text, and answers like any other', async () => {
    await db.pool.connect(async (connection) => {
      const answers = [];
      for (const value of [1, 2, 3]) answers.push(await connection.oneFirst(sql.type(z.object({ doubled: z.number() }))`${PREPARED} SELECT ${value}::int * 2 AS doubled`));
      expect(answers).toEqual([2, 4, 6]);
      // An unmarked statement is not prepared.
      await connection.query(sql.unsafe`SELECT ${1}::int AS plain`);
      const statements = await connection.any(sessionStatements);
      expect(statements).toHaveLength(1);
      expect(statements[0]!.name).toMatch(/^keel_[0-9a-f]{24}_0$/);
      expect(statements[0]!.statement).toMatch(/^\/\* keel:prepared \*\/ SELECT \$1::int \* 2 AS doubled$/);
      expect(statements[0]!.from_sql, 'prepared by the protocol, not by PREPARE').toBe(false);
    });
  });

  it('is prepared again under its next name after 100 runs on its connection: a plan made while the tables were empty is not kept', async () => {
    await db.pool.connect(async (connection) => {
      for (let run = 0; run < 101; run += 1) await connection.query(sql.unsafe`${PREPARED} SELECT count(*) AS n FROM runs WHERE id = ${'00000000-0000-0000-0000-000000000000'}`);
      const names = (await connection.any(sessionStatements)).filter((statement) => statement.statement.includes('FROM runs')).map((statement) => statement.name.slice(-2));
      expect(names.sort(), 'the first name for runs 1–100, the next from run 101').toEqual(['_0', '_1']);
    });
  });

  it('fails like any statement on bad input, and the connection goes on', async () => {
    await db.pool.connect(async (connection) => {
      await expect(connection.query(sql.unsafe`${PREPARED} SELECT ${'not a number'}::int AS n`)).rejects.toThrow(/invalid input syntax for type integer/);
      expect(await connection.oneFirst(sql.type(z.object({ n: z.number() }))`${PREPARED} SELECT ${'7'}::int AS n`)).toBe(7);
    });
  });
});

describe('namedIfPrepared', () => {
  it('names marked texts by their content and passes every other text through', () => {
    const counts = new Map<string, number>();
    const first = namedIfPrepared('/* keel:prepared */ SELECT 1', counts);
    expect(first).toEqual({ text: '/* keel:prepared */ SELECT 1', name: expect.stringMatching(/^keel_[0-9a-f]{24}_0$/) });
    expect(namedIfPrepared('/* keel:prepared */ SELECT 1', counts)).toEqual(first);
    expect((namedIfPrepared('/* keel:prepared */ SELECT 2', counts) as { name: string }).name).not.toBe((first as { name: string }).name);
    expect(namedIfPrepared('SELECT 1', counts)).toBe('SELECT 1');
  });

  it('prepares a statement again on its connection after 100, 1,000, 10,000 and 100,000 runs, and then keeps it', () => {
    const counts = new Map<string, number>();
    const names = Array.from({ length: 100_010 }, () => (namedIfPrepared('/* keel:prepared */ SELECT 3', counts) as { name: string }).name);
    const generation = (run: number) => names[run]!.slice(-2);
    expect([0, 99, 100, 999, 1_000, 9_999, 10_000, 99_999, 100_000, 100_009].map(generation)).toEqual(['_0', '_0', '_1', '_1', '_2', '_2', '_3', '_3', '_4', '_4']);
    expect(new Set(names).size, 'five statements per text and connection at most').toBe(5);
    // Another connection counts its own runs.
    expect((namedIfPrepared('/* keel:prepared */ SELECT 3', new Map()) as { name: string }).name.slice(-2)).toBe('_0');
  });

  it('names at most 64 texts: a marked text that varies would otherwise fill every session with statements', () => {
    const counts = new Map<string, number>();
    const earlier = namedIfPrepared('/* keel:prepared */ SELECT 1', new Map());
    const named = Array.from({ length: 80 }, (_, index) => namedIfPrepared(`/* keel:prepared */ SELECT ${index} AS varying`, counts));
    // The tests above named a few texts already (this file's module state): the cap counts them too.
    const given = named.filter((query) => typeof query === 'object').length;
    expect(given).toBeGreaterThan(50);
    expect(given).toBeLessThan(64);
    expect(named.slice(-1)[0], 'past the cap, a new text goes unnamed').toBe('/* keel:prepared */ SELECT 79 AS varying');
    expect(namedIfPrepared('/* keel:prepared */ SELECT 1', new Map()), 'a text named before keeps its name').toEqual(earlier);
  });
});
