import { describe, it, expect } from 'vitest';
import {
  DEFAULT_PRIVACY_LEVEL,
  PRIVACY_LEVELS,
  assertPrivacyLevel,
  compareLevels,
  isPrivacyLevel,
  isStricter,
  strictestLevel,
  tightenOnly,
  type PrivacyLevel,
} from '../../../src/privacy/privacy-level.js';

// The order is written out here on purpose rather than read from the module under test, so that a
// reordering of PRIVACY_LEVELS fails these tests instead of silently redefining "stricter".
const ORDER: readonly PrivacyLevel[] = ['none', 'metadata', 'redacted', 'full'];
const rank = (level: PrivacyLevel): number => ORDER.indexOf(level);
const pairs: Array<[PrivacyLevel, PrivacyLevel]> = ORDER.flatMap((a) => ORDER.map((b): [PrivacyLevel, PrivacyLevel] => [a, b]));

describe('PRIVACY_LEVELS', () => {
  it('lists the four levels strictest first', () => {
    expect(PRIVACY_LEVELS).toEqual(['none', 'metadata', 'redacted', 'full']);
  });

  it('defaults to metadata', () => {
    expect(DEFAULT_PRIVACY_LEVEL).toBe('metadata');
  });
});

describe('isPrivacyLevel', () => {
  it.each(ORDER)('accepts %s', (level) => {
    expect(isPrivacyLevel(level)).toBe(true);
  });

  it.each([
    'None',
    'FULL',
    ' full',
    'full ',
    'redact',
    'metadata\n',
    '',
    'toString',
    '__proto__',
    'hasOwnProperty',
    'constructor',
    0,
    1,
    null,
    undefined,
    true,
    {},
    ['full'],
    Symbol('full'),
  ])('refuses %s', (value) => {
    expect(isPrivacyLevel(value)).toBe(false);
  });
});

describe('assertPrivacyLevel', () => {
  it('passes a level through', () => {
    expect(() => assertPrivacyLevel('redacted')).not.toThrow();
  });

  it('throws a TypeError naming the bad value and the field', () => {
    expect(() => assertPrivacyLevel('secret', 'agent answerLevel')).toThrow(TypeError);
    expect(() => assertPrivacyLevel('secret', 'agent answerLevel')).toThrow(/agent answerLevel: "secret"/);
  });
});

describe('compareLevels (all 4x4 pairs)', () => {
  it.each(pairs)('compareLevels(%s, %s) has the sign of rank(a) - rank(b)', (a, b) => {
    expect(Math.sign(compareLevels(a, b))).toBe(Math.sign(rank(a) - rank(b)));
  });

  it('sorts levels strictest first', () => {
    expect([...ORDER].reverse().sort(compareLevels)).toEqual(ORDER);
  });

  it('is antisymmetric and zero only on equal levels', () => {
    for (const [a, b] of pairs) {
      // Sum, not negation: -Math.sign(0) is -0, which toBe distinguishes from 0.
      expect(Math.sign(compareLevels(a, b)) + Math.sign(compareLevels(b, a))).toBe(0);
      expect(compareLevels(a, b) === 0).toBe(a === b);
    }
  });

  it('throws on a non-level', () => {
    expect(() => compareLevels('full', 'everything' as PrivacyLevel)).toThrow(TypeError);
    expect(() => compareLevels('nope' as PrivacyLevel, 'full')).toThrow(TypeError);
  });
});

describe('isStricter (all 4x4 pairs)', () => {
  it.each(pairs)('isStricter(%s, %s)', (a, b) => {
    expect(isStricter(a, b)).toBe(rank(a) < rank(b));
  });
});

describe('tightenOnly (all 4x4 pairs)', () => {
  // Expected results written as a matrix: row = current, column = requested.
  const expected: Record<PrivacyLevel, Record<PrivacyLevel, PrivacyLevel>> = {
    none: { none: 'none', metadata: 'none', redacted: 'none', full: 'none' },
    metadata: { none: 'none', metadata: 'metadata', redacted: 'metadata', full: 'metadata' },
    redacted: { none: 'none', metadata: 'metadata', redacted: 'redacted', full: 'redacted' },
    full: { none: 'none', metadata: 'metadata', redacted: 'redacted', full: 'full' },
  };

  it.each(pairs)('tightenOnly(current %s, requested %s)', (current, requested) => {
    const result = tightenOnly(current, requested);
    expect(result).toBe(expected[current][requested]);
    // Never looser than either input.
    expect(rank(result)).toBeLessThanOrEqual(rank(current));
    expect(rank(result)).toBeLessThanOrEqual(rank(requested));
  });

  it.each(ORDER)('keeps %s when nothing is requested', (current) => {
    expect(tightenOnly(current, undefined)).toBe(current);
  });

  it('cannot be loosened by a sequence of requests (all 4x4x4 sequences)', () => {
    for (const start of ORDER) {
      for (const r1 of ORDER) {
        for (const r2 of ORDER) {
          const result = tightenOnly(tightenOnly(start, r1), r2);
          expect(rank(result)).toBe(Math.min(rank(start), rank(r1), rank(r2)));
        }
      }
    }
  });

  it('throws on a non-level', () => {
    expect(() => tightenOnly('full', 'x' as PrivacyLevel)).toThrow(TypeError);
    expect(() => tightenOnly('x' as PrivacyLevel, undefined)).toThrow(TypeError);
  });
});

describe('strictestLevel', () => {
  it.each(ORDER)('of a single level %s is that level', (level) => {
    expect(strictestLevel(level)).toBe(level);
  });

  it.each(pairs)('strictestLevel(%s, %s)', (a, b) => {
    expect(strictestLevel(a, b)).toBe(ORDER[Math.min(rank(a), rank(b))]);
  });

  it('is the minimum of every 4x4x4 triple, in any argument order', () => {
    let checked = 0;
    for (const a of ORDER) {
      for (const b of ORDER) {
        for (const c of ORDER) {
          const want = ORDER[Math.min(rank(a), rank(b), rank(c))];
          expect(strictestLevel(a, b, c)).toBe(want);
          expect(strictestLevel(c, b, a)).toBe(want);
          expect(strictestLevel(b, c, a)).toBe(want);
          checked += 1;
        }
      }
    }
    expect(checked).toBe(64);
  });

  it('accepts a spread of a non-empty list', () => {
    const levels: [PrivacyLevel, ...PrivacyLevel[]] = ['full', 'redacted', 'full', 'metadata'];
    expect(strictestLevel(...levels)).toBe('metadata');
  });

  it('throws on a non-level anywhere in the list', () => {
    expect(() => strictestLevel('bogus' as PrivacyLevel)).toThrow(TypeError);
    expect(() => strictestLevel('full', 'bogus' as PrivacyLevel)).toThrow(TypeError);
  });
});
