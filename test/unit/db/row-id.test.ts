import { describe, expect, it } from 'vitest';
import { newRowId } from '../../../src/db/row-id.js';
import { isUuid } from '../../../src/db/uuid.js';
import { millisecondsOf, VERSION_7_UUID } from '../../support/uuid-v7.js';

// The ids Keel mints for its rows (decision 0045): RFC 9562 version 7 UUIDs, whose first 48 bits
// are the Unix time in milliseconds, so that rows inserted together are neighbours in every index
// that starts with their id. Ids minted one after another by a process always increase, in the
// same millisecond too.

describe('newRowId', () => {
  it('is a canonical version 7 UUID carrying the time it was minted', () => {
    const before = Date.now();
    const id = newRowId();
    const after = Date.now();
    expect(isUuid(id)).toBe(true);
    expect(id).toMatch(VERSION_7_UUID);
    expect(millisecondsOf(id)).toBeGreaterThanOrEqual(before);
    expect(millisecondsOf(id)).toBeLessThanOrEqual(after);
  });

  it('increases from one id to the next, many in the same millisecond included, and never repeats', () => {
    const ids = Array.from({ length: 20_000 }, () => newRowId());
    const sameMillisecond = ids.filter((id, index) => index > 0 && millisecondsOf(id) === millisecondsOf(ids[index - 1]!)).length;
    expect(sameMillisecond).toBeGreaterThan(1_000);
    for (let index = 1; index < ids.length; index += 1) expect(ids[index]! > ids[index - 1]!).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
  });
});
