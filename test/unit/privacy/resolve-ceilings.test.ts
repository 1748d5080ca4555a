import { describe, it, expect } from 'vitest';
import type { PrivacyLevel } from '../../../src/privacy/privacy-level.js';
import {
  answerBaseLevel,
  answerIsRetainable,
  ceilingTightened,
  resolveCeilings,
  tightenCeilings,
  type CeilingOverrides,
  type Ceilings,
} from '../../../src/privacy/resolve-ceilings.js';

const ORDER: readonly PrivacyLevel[] = ['none', 'metadata', 'redacted', 'full'];
const OPTIONAL: ReadonlyArray<PrivacyLevel | undefined> = [undefined, ...ORDER];
const rank = (level: PrivacyLevel): number => ORDER.indexOf(level);
const min = (...levels: Array<PrivacyLevel | undefined>): PrivacyLevel =>
  ORDER[Math.min(...levels.filter((l): l is PrivacyLevel => l !== undefined).map(rank))];

describe('resolveCeilings: the global level alone', () => {
  // docs/architecture.md, "Privacy": both ceilings start from privacy.level; for answers a global
  // `metadata` keeps a full answer.
  it.each<[PrivacyLevel | undefined, Ceilings]>([
    [undefined, { auditLevel: 'metadata', answerLevel: 'full' }],
    ['none', { auditLevel: 'none', answerLevel: 'none' }],
    ['metadata', { auditLevel: 'metadata', answerLevel: 'full' }],
    ['redacted', { auditLevel: 'redacted', answerLevel: 'redacted' }],
    ['full', { auditLevel: 'full', answerLevel: 'full' }],
  ])('global %s resolves to %o', (global, want) => {
    expect(resolveCeilings({ global })).toEqual(want);
  });

  it('defaults to metadata audit and full answer when given nothing', () => {
    expect(resolveCeilings({})).toEqual({ auditLevel: 'metadata', answerLevel: 'full' });
  });

  it.each<[PrivacyLevel, PrivacyLevel]>([
    ['none', 'none'],
    ['metadata', 'full'],
    ['redacted', 'redacted'],
    ['full', 'full'],
  ])('answerBaseLevel(%s) is %s', (global, want) => {
    expect(answerBaseLevel(global)).toBe(want);
  });
});

describe('resolveCeilings: provider and agent tighten, never loosen', () => {
  it('the example config: global metadata, llm provider {metadata, redacted}, echo agent {answer full}', () => {
    expect(
      resolveCeilings({
        global: 'metadata',
        provider: { auditLevel: 'metadata', answerLevel: 'redacted' },
        agent: { answerLevel: 'full' },
      }),
    ).toEqual({ auditLevel: 'metadata', answerLevel: 'redacted' });
    expect(resolveCeilings({ global: 'metadata', provider: {}, agent: { answerLevel: 'full' } })).toEqual({
      auditLevel: 'metadata',
      answerLevel: 'full',
    });
  });

  it('an agent cannot loosen a redacted global to full', () => {
    expect(resolveCeilings({ global: 'redacted', agent: { auditLevel: 'full', answerLevel: 'full' } })).toEqual({
      auditLevel: 'redacted',
      answerLevel: 'redacted',
    });
  });

  it('an agent or provider cannot loosen a global none', () => {
    expect(
      resolveCeilings({
        global: 'none',
        provider: { auditLevel: 'full', answerLevel: 'full' },
        agent: { auditLevel: 'full', answerLevel: 'full' },
      }),
    ).toEqual({ auditLevel: 'none', answerLevel: 'none' });
  });

  it('global metadata: the audit ceiling cannot be loosened even though the answer starts at full', () => {
    expect(resolveCeilings({ global: 'metadata', agent: { auditLevel: 'full' } })).toEqual({
      auditLevel: 'metadata',
      answerLevel: 'full',
    });
  });

  it('an agent answer ceiling of metadata under a global metadata is metadata (not retainable)', () => {
    const ceilings = resolveCeilings({ global: 'metadata', agent: { answerLevel: 'metadata' } });
    expect(ceilings.answerLevel).toBe('metadata');
    expect(answerIsRetainable(ceilings.answerLevel)).toBe(false);
  });

  it('the two ceilings are independent', () => {
    expect(resolveCeilings({ global: 'full', provider: { auditLevel: 'none' } })).toEqual({
      auditLevel: 'none',
      answerLevel: 'full',
    });
    expect(resolveCeilings({ global: 'full', agent: { answerLevel: 'redacted' } })).toEqual({
      auditLevel: 'full',
      answerLevel: 'redacted',
    });
  });

  it('undefined overrides and undefined fields change nothing', () => {
    expect(resolveCeilings({ global: 'full', provider: undefined, agent: { auditLevel: undefined } })).toEqual({
      auditLevel: 'full',
      answerLevel: 'full',
    });
  });

  it('matches an independent oracle for every combination (global 5 x provider 25 x agent 25)', () => {
    let checked = 0;
    for (const global of OPTIONAL) {
      for (const pAudit of OPTIONAL) {
        for (const pAnswer of OPTIONAL) {
          for (const aAudit of OPTIONAL) {
            for (const aAnswer of OPTIONAL) {
              const provider: CeilingOverrides = { auditLevel: pAudit, answerLevel: pAnswer };
              const agent: CeilingOverrides = { auditLevel: aAudit, answerLevel: aAnswer };
              const g = global ?? 'metadata';
              const answerBase = g === 'metadata' ? 'full' : g;
              const got = resolveCeilings({ global, provider, agent });
              expect(got).toEqual({ auditLevel: min(g, pAudit, aAudit), answerLevel: min(answerBase, pAnswer, aAnswer) });
              // Tighten-only: never looser than the base, nor than any override that was given.
              expect(rank(got.auditLevel)).toBeLessThanOrEqual(rank(g));
              expect(rank(got.answerLevel)).toBeLessThanOrEqual(rank(answerBase));
              // Provider and agent are symmetric.
              expect(resolveCeilings({ global, provider: agent, agent: provider })).toEqual(got);
              checked += 1;
            }
          }
        }
      }
    }
    expect(checked).toBe(5 ** 5);
  });

  it.each([
    [{ global: 'everything' as PrivacyLevel }, /global privacy level/],
    [{ global: 'full' as PrivacyLevel, provider: { auditLevel: 'loud' as PrivacyLevel } }, /provider auditLevel/],
    [{ global: 'full' as PrivacyLevel, provider: { answerLevel: 'FULL' as PrivacyLevel } }, /provider answerLevel/],
    [{ global: 'full' as PrivacyLevel, agent: { auditLevel: '' as PrivacyLevel } }, /agent auditLevel/],
    [{ global: 'full' as PrivacyLevel, agent: { answerLevel: 'all' as PrivacyLevel } }, /agent answerLevel/],
  ])('throws on an invalid level (%o)', (input, message) => {
    expect(() => resolveCeilings(input)).toThrow(message);
  });
});

describe('tightenCeilings (fallback providers)', () => {
  it('takes the stricter of each ceiling for every 4x4 x 4x4 combination', () => {
    for (const a1 of ORDER) {
      for (const r1 of ORDER) {
        for (const a2 of ORDER) {
          for (const r2 of ORDER) {
            expect(tightenCeilings({ auditLevel: a1, answerLevel: r1 }, { auditLevel: a2, answerLevel: r2 })).toEqual({
              auditLevel: min(a1, a2),
              answerLevel: min(r1, r2),
            });
          }
        }
      }
    }
  });

  it('a fallback with a looser provider keeps the tighter ceiling of the first attempt', () => {
    const first = resolveCeilings({ global: 'full', provider: { answerLevel: 'redacted' } });
    const fallback = resolveCeilings({ global: 'full', provider: {} });
    expect(tightenCeilings(first, fallback)).toEqual({ auditLevel: 'full', answerLevel: 'redacted' });
  });
});

describe('answerIsRetainable', () => {
  it.each<[PrivacyLevel, boolean]>([
    ['none', false],
    ['metadata', false],
    ['redacted', true],
    ['full', true],
  ])('%s -> %s', (level, want) => {
    expect(answerIsRetainable(level)).toBe(want);
  });

  it('throws on a non-level rather than guessing', () => {
    expect(() => answerIsRetainable('maybe' as PrivacyLevel)).toThrow(TypeError);
  });
});

describe('ceilingTightened (all 4x4 pairs)', () => {
  const pairs = ORDER.flatMap((before) => ORDER.map((after): [PrivacyLevel, PrivacyLevel] => [before, after]));
  it.each(pairs)('before %s, after %s', (before, after) => {
    expect(ceilingTightened(before, after)).toBe(rank(after) < rank(before));
  });
});
