import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toBinaryArray, type BinaryElementType } from '../../../src/db/binary-array.js';
import { createEmptyDatabase } from '../../support/test-database.js';

// The hot path's batch statements send their array columns in Postgres's binary format
// (decision 0037). Postgres must read each array exactly as it reads the text literal
// node-postgres writes for the same JS array: the same elements, nulls where the nulls were.
// Both go through node-postgres itself, as the statements do: the Buffer as a binary parameter,
// the JS array as its text literal. Compared in Postgres (IS NOT DISTINCT FROM on the two arrays),
// then as text.

let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
let client: pg.Client;
beforeAll(async () => {
  database = await createEmptyDatabase();
  client = new pg.Client({ connectionString: database.url });
  await client.connect();
});
afterAll(async () => {
  await client?.end();
  await database?.drop();
});

type Compared = { same: boolean; binary: string | null; text: string | null };

async function readBoth(type: BinaryElementType, values: readonly unknown[]): Promise<Compared> {
  const binary = toBinaryArray(type, values);
  expect(binary, `${type} encodes`).not.toBeNull();
  const { rows } = await client.query<Compared>(
    `SELECT b IS NOT DISTINCT FROM t AS same, b::text AS binary, t::text AS text FROM (SELECT $1::${type}[] AS b, $2::${type}[] AS t) AS both_ways`,
    [binary, values],
  );
  return rows[0]!;
}

const cases: Array<[BinaryElementType, unknown[]]> = [
  ['bytea', [Buffer.from([0, 1, 2, 255]), null, Buffer.alloc(0), Buffer.from('\\"{},', 'utf8')]],
  ['text', ['plain', '', 'quote " backslash \\ brace { } comma ,', 'NULL', null, 'é 漢字 🙂', ' lead and trail ', 'long '.repeat(40), 'lång '.repeat(40)]],
  ['jsonb', ['{"a":"b\\"c","n":[1,2.5,null],"u":"\\u00e9"}', '"just a string"', '12', 'null', null, '{}', JSON.stringify({ long: 'é'.repeat(100), list: Array.from({ length: 30 }, (_, n) => n) })]],
  ['uuid', ['0b5a1c9e-9f7e-4d0a-8a61-2f3c4d5e6f70', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', null]],
  ['int4', [0, -0, 1, -1, 2 ** 31 - 1, -(2 ** 31), null]],
  ['int8', [0, -1, Number.MAX_SAFE_INTEGER, Number.MIN_SAFE_INTEGER, 1_796_194_320_594, null]],
  ['float8', [0, -0, -0.5, 1.7e308, 5e-324, Date.now() + 0.25, Infinity, -Infinity, NaN, null]],
  ['bool', [true, false, null]],
];

describe('an array in the binary format', () => {
  for (const [type, values] of cases) {
    it(`is read as its text literal is: ${type}[]`, async () => {
      const read = await readBoth(type, values);
      expect(read.binary).toBe(read.text);
      expect(read.same).toBe(true);
    });
  }

  it('is read as its text literal is when empty or all null', async () => {
    for (const type of ['text', 'bytea', 'uuid', 'int8'] as const) {
      for (const values of [[], [null, null]]) {
        const read = await readBoth(type, values);
        expect(read.binary, `${type} ${JSON.stringify(values)}`).toBe(read.text);
        expect(read.same).toBe(true);
      }
    }
  });

  it('is not made from an element the text literal would read otherwise: the array then goes as text', () => {
    expect(toBinaryArray('int4', [1, 2 ** 31])).toBeNull();
    expect(toBinaryArray('int4', [1.5])).toBeNull();
    expect(toBinaryArray('int8', [2 ** 53])).toBeNull();
    expect(toBinaryArray('int8', ['12'])).toBeNull();
    expect(toBinaryArray('uuid', ['{0b5a1c9e-9f7e-4d0a-8a61-2f3c4d5e6f70}'])).toBeNull();
    expect(toBinaryArray('uuid', ['not-a-uuid'])).toBeNull();
    expect(toBinaryArray('jsonb', [{ a: 1 }])).toBeNull();
    expect(toBinaryArray('bytea', ['\\x00'])).toBeNull();
    expect(toBinaryArray('text', [12])).toBeNull();
  });

  it('with a text element Postgres refuses (a NUL byte) fails as the text literal does, and the connection goes on', async () => {
    const refused = /invalid byte sequence for encoding "UTF8": 0x00/;
    await expect(client.query('SELECT $1::text[] AS b', [toBinaryArray('text', ['a\u0000b'])])).rejects.toThrow(refused);
    await expect(client.query('SELECT $1::text[] AS t', [['a\u0000b']])).rejects.toThrow(refused);
    expect((await client.query<{ n: number }>('SELECT 1 AS n')).rows[0]!.n).toBe(1);
  });
});
