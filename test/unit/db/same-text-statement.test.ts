import { randomUUID } from 'node:crypto';
import { sql } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { toBinaryArray } from '../../../src/db/binary-array.js';
import { SameTextStatement } from '../../../src/db/same-text-statement.js';
import { creationStatement } from '../../../src/writes/task-creation.js';
import { heldCompletionStatement } from '../../../src/writes/complete-held-runs.js';
import { creationsAndCompletionsStatement } from '../../../src/writes/task-write-batch.js';
import { commonCompletionStatement } from '../../../src/writes/complete-runs-together.js';

// A statement built once and given each call's rows (decision 0035) must be exactly what slonik
// builds from the same rows, fragment by fragment: the same text and the same values in the same
// places. A build it cannot reproduce that way is refused when the statement is made.

const row = z.object({ n: z.number() });

type Sets = [pairs: ReadonlyArray<readonly [string, number]>, names: readonly string[]];

const toy = (sets: Sets) => {
  const [pairs, names] = sets;
  return sql.type(row)`WITH p AS (SELECT * FROM ${sql.unnest(pairs as unknown as unknown[][], ['text', 'int4'])} AS p(a, b))
    SELECT count(*)::int AS n FROM p, unnest(${sql.array([...names], 'text')}) AS q WHERE p.a <> ${'constant'} AND p.b = ANY(${sql.array([1, 2], 'int4')}) AND ${sql.identifier(['p', 'a'])} IS NOT NULL`;
};

describe('SameTextStatement', () => {
  it('gives the text slonik builds and each column where slonik puts it, for batches of any size', () => {
    const statement = new SameTextStatement(toy, [2, 'list']);
    const batches: Sets[] = [
      [[], []],
      [[['a', 1]], ['x']],
      [
        [
          ['a', 1],
          ['b"\\', 2],
          ['c', 3],
        ],
        ['x', 'y'],
      ],
    ];
    const texts = new Set<string>();
    for (const sets of batches) {
      const fast = statement.with(sets);
      const built = statement.builtBySlonik(sets);
      expect(fast.sql).toBe(built.sql);
      expect(fast.values).toEqual(built.values);
      expect(fast.type).toBe(built.type);
      expect(fast.parser).toBe(built.parser);
      texts.add(fast.sql);
    }
    expect(texts.size).toBe(1);
    // The constants stay where they were: the scalar and the constant array. The columns go in
    // Postgres's binary array format (decision 0037).
    expect(statement.with(batches[1]!).values).toEqual([toBinaryArray('text', ['a']), toBinaryArray('int4', [1]), toBinaryArray('text', ['x']), 'constant', [1, 2]]);
  });

  it('refuses a build that computes from a cell, puts one into the text, or uses one twice', () => {
    const computed = (sets: Sets) => sql.unsafe`SELECT * FROM ${sql.unnest(
      sets[0].map(([a, b]) => [`${a}!`, b]),
      ['text', 'int4'],
    )} AS p(a, b), unnest(${sql.array([...sets[1]], 'text')}) AS q`;
    expect(() => new SameTextStatement(computed, [2, 'list'])).toThrow(/derived from a cell/);

    const inText = (sets: Sets) => sql.unsafe`SELECT * FROM ${sql.unnest(sets[0] as unknown as unknown[][], ['text', 'int4'])} AS p(a, b), ${sql.identifier([sets[1][0] ?? 'none'])}`;
    expect(() => new SameTextStatement(inText, [2, 'list'])).toThrow(/into the text/);

    const twice = (sets: Sets) => sql.unsafe`SELECT * FROM ${sql.unnest(sets[0] as unknown as unknown[][], ['text', 'int4'])} AS p(a, b),
      ${sql.unnest(sets[0] as unknown as unknown[][], ['text', 'int4'])} AS o(a, b), unnest(${sql.array([...sets[1]], 'text')}) AS q`;
    expect(() => new SameTextStatement(twice, [2, 'list'])).toThrow(/used twice/);

    const dropped = (sets: Sets) => sql.unsafe`SELECT * FROM ${sql.unnest(
      sets[0].map(([a]) => [a]),
      ['text'],
    )} AS p(a), unnest(${sql.array([...sets[1]], 'text')}) AS q`;
    expect(() => new SameTextStatement(dropped, [2, 'list'])).toThrow(/does not reach the statement/);
  });

  it('refuses rows of the wrong width and the wrong number of row sets', () => {
    const statement = new SameTextStatement(toy, [2, 'list']);
    expect(() => statement.with([[['a', 1, 'extra'] as unknown as readonly [string, number]], []])).toThrow(/has 3 cells, not 2/);
    expect(() => statement.with([[]] as unknown as Sets)).toThrow(/1 row sets for 2/);
  });
});

describe("the hot path's statements", () => {
  const sealed = (length: number) => Buffer.alloc(length, 7);

  function creationSets(): Parameters<typeof creationStatement.with>[0] {
    const ids = [randomUUID(), randomUUID()];
    const at = Date.now();
    return [
      ids.map((id) => [randomUUID(), id, id] as const),
      ids.map((id, index) => [id, 'echo', index === 0 ? 'running' : 'queued', 'metadata', 'full', null, id, sealed(120), index === 0 ? 'worker-1' : null, index === 0 ? randomUUID() : null, index === 0 ? 30_000 : null, index === 0 ? at : null, index === 0 ? 2 : 1, index === 0 ? '0af7651916cd43dd8448eb211c80319c' : null, index === 0 ? 'b7ad6b7169203331' : null, null]),
      ids.map((id, index) => [id, randomUUID(), randomUUID(), 'echo', 'TASK_STATE_WORKING', 'full', sealed(90), '{"a":"b\\"c"}', at, 2, 1, 'TASK_STATE_WORKING', index === 0 ? `m-${id}` : null, index === 0 ? sealed(40) : null]),
      [[ids[0]!, 1, ids[0]!, 2, 0, 'status', 'TASK_STATE_WORKING', sealed(200)]],
    ];
  }

  it('the creation statement is what slonik builds from the same rows', () => {
    const sets = creationSets();
    const fast = creationStatement.with(sets);
    const built = creationStatement.builtBySlonik(sets);
    expect(fast.sql).toBe(built.sql);
    expect(fast.values).toEqual(built.values);
    expect(fast.values.filter(Array.isArray), 'every column goes as a binary array').toEqual([]);
  });

  it('the held completion statement is what slonik builds from the same rows', () => {
    const sets = heldSets();
    const fast = heldCompletionStatement.with(sets);
    const built = heldCompletionStatement.builtBySlonik(sets);
    expect(fast.sql).toBe(built.sql);
    expect(fast.values).toEqual(built.values);
    expect(fast.values.filter(Array.isArray), 'every column goes as a binary array; the one array left is a constant of the text').toEqual([['running']]);
  });

  it('the statement of creations and held completions together is what slonik builds from the same rows, and holds both statements\' CTEs', () => {
    const sets = [...creationSets(), ...heldSets()] as unknown as Parameters<typeof creationsAndCompletionsStatement.with>[0];
    const fast = creationsAndCompletionsStatement.with(sets);
    const built = creationsAndCompletionsStatement.builtBySlonik(sets);
    expect(fast.sql).toBe(built.sql);
    expect(fast.values).toEqual(built.values);
    for (const cte of ['new_contexts AS', 'new_runs AS', 'new_tasks AS', 'new_events AS', 'held AS MATERIALIZED', 'settled AS', 'notified AS']) expect(fast.sql).toContain(cte);
    expect(fast.values.filter(Array.isArray)).toEqual([['running']]);
  });

  function heldSets(): Parameters<typeof heldCompletionStatement.with>[0] {
    const runId = randomUUID();
    const at = Date.now();
    return [
      [[runId, runId, 'worker-1', randomUUID(), 2, 'full', 1, 2, 'TASK_STATE_WORKING', sealed(90)]],
      [
        [runId, 1, 'claimed', '{"worker":"worker-1"}', at],
        [runId, 2, 'completed', '{}', at + 1],
      ],
      [[runId, sealed(150), null, false, null, false, 'full', 3, 3, at + 2]],
      [[runId, 'worker-1', randomUUID(), 'completed', false, 1, 0, 10, 20, at + 2]],
      [
        [runId, 2, runId, 3, 0, 'artifact', null, sealed(180)],
        [runId, 3, runId, 3, 1, 'status', 'TASK_STATE_COMPLETED', sealed(220)],
      ],
      [`${runId} 3 1`],
    ];
  }

  it("the completion transaction's writing statement is what slonik builds from the same rows", () => {
    const runs = [randomUUID(), randomUUID()];
    const at = Date.now();
    const sets: Parameters<typeof commonCompletionStatement.with>[0] = [
      runs.map((runId, index) => [runId, index + 1, 'completed', '{"a":"\\u00e9"}', at] as const),
      runs.map((runId) => [runId, sealed(150), sealed(40), true, sealed(300), false, 'redacted', 5, 4, null] as const),
      runs.map((runId) => [runId, 'worker-2', randomUUID(), 'completed', false, 2, 1, 30, 40, null] as const),
      runs.map((runId) => [runId, 4, runId, 5, 0, 'status', 'TASK_STATE_COMPLETED', sealed(220)] as const),
      runs.map((runId) => `${runId} 4 1`),
    ];
    const fast = commonCompletionStatement.with(sets);
    const built = commonCompletionStatement.builtBySlonik(sets);
    expect(fast.sql).toBe(built.sql);
    expect(fast.values).toEqual(built.values);
    expect(fast.values.filter(Array.isArray), 'every column goes as a binary array; the one array left is a constant of the text').toEqual([['running']]);
  });
});
