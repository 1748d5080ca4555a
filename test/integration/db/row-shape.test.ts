import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { RowShape, rowShape } from '../../../src/db/row-shape.js';
import { JOURNAL_ROW } from '../../../src/tasks/journal-writer.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// The hot statements' rows are built by column name from one list of names and types per row
// shape (src/db/row-shape.ts), which also gives the unnest its types and its alias. Two columns
// of the same type swapped in that list can therefore not write each other's values: the swap
// moves the name, the type and the value together. With rows written as positional tuples, the
// same swap in one of the three lists wrote sequence into ordinal without an error.

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase({ migrate: false });
  await db.pool.query(sql.unsafe`CREATE TABLE events (task_id uuid, sequence int4, run_id uuid, run_revision int8, ordinal int4, kind text, state text, payload bytea)`);
});
afterAll(async () => db?.drop());

const stored = z.object({ sequence: z.number(), ordinal: z.number(), run_revision: z.number(), kind: z.string(), state: z.string().nullable() });

/** The journal's shape with two of its int4 columns (sequence, ordinal) in each other's place. */
function swapped(): RowShape<(typeof JOURNAL_ROW.names)[number]> {
  const columns = [...JOURNAL_ROW.columns];
  const sequence = columns.findIndex((column) => column.name === 'sequence');
  const ordinal = columns.findIndex((column) => column.name === 'ordinal');
  expect(columns[sequence]!.type).toBe(columns[ordinal]!.type);
  [columns[sequence], columns[ordinal]] = [columns[ordinal]!, columns[sequence]!];
  return new RowShape(columns);
}

const values = {
  task_id: '01900000-0000-7000-8000-000000000001',
  sequence: 7,
  run_id: '01900000-0000-7000-8000-000000000002',
  run_revision: 3,
  ordinal: 2,
  kind: 'status',
  state: 'TASK_STATE_COMPLETED',
  payload: Buffer.from('sealed'),
};

async function writeThrough(shape: RowShape<(typeof JOURNAL_ROW.names)[number]>, rows: readonly (readonly unknown[])[]) {
  await db.pool.query(sql.unsafe`TRUNCATE events`);
  await db.pool.query(sql.unsafe`INSERT INTO events (task_id, sequence, run_id, run_revision, ordinal, kind, state, payload)
    SELECT j.task_id, j.sequence, j.run_id, j.run_revision, j.ordinal, j.kind, j.state, j.payload FROM ${shape.unnest(rows, 'j')}`);
  return db.pool.one(sql.type(stored)`SELECT sequence, ordinal, run_revision, kind, state FROM events`);
}

describe('row shapes', () => {
  it('write each value to its named column, whatever the order of the columns in the shape', async () => {
    const original = await writeThrough(JOURNAL_ROW, [JOURNAL_ROW.row(values)]);
    const reordered = swapped();
    expect(await writeThrough(reordered, [reordered.row(values)])).toEqual(original);
    expect(original).toMatchObject({ sequence: 7, ordinal: 2, run_revision: 3 });
  });

  it('catch the swap a positional tuple hides: the same cells through the swapped columns land in each other\'s place', async () => {
    // What a hand-written tuple does when one list (here the unnest's) is reordered and the others are not.
    const tuple = JOURNAL_ROW.row(values);
    const misplaced = await writeThrough(swapped(), [tuple]);
    expect(misplaced).toMatchObject({ sequence: 2, ordinal: 7 });
  });

  it('refuse a row without a value for one of its columns, before anything is sent', () => {
    const { ordinal: _ordinal, ...missing } = values;
    expect(() => JOURNAL_ROW.row(missing as typeof values)).toThrow('row shape: no value for column ordinal');
  });

  it('refuse a shape that names a column twice', () => {
    expect(() =>
      rowShape([
        ['a', 'int4'],
        ['a', 'int4'],
      ]),
    ).toThrow('a column name is used twice');
  });
});
