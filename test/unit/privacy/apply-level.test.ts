import { describe, it, expect, expectTypeOf } from 'vitest';
import { applyLevel, scrubToCeiling } from '../../../src/privacy/apply-level.js';
import type { PrivacyLevel } from '../../../src/privacy/privacy-level.js';
import { redactValue } from '../../../src/privacy/redact.js';
import { summarizeValue, type ValueSummary } from '../../../src/privacy/summarize.js';

const ORDER: readonly PrivacyLevel[] = ['none', 'metadata', 'redacted', 'full'];
const rank = (level: PrivacyLevel): number => ORDER.indexOf(level);

const answer = {
  artifacts: [{ artifactId: 'a1', parts: [{ text: 'Contact alice@example.com, key token=abc123' }] }],
  count: 2,
};

describe('applyLevel', () => {
  it('full keeps the value unchanged (same reference)', () => {
    expect(applyLevel('full', answer)).toBe(answer);
  });

  it('redacted masks secrets and keeps the shape', () => {
    const out = applyLevel('redacted', answer);
    expect(out).toEqual({
      artifacts: [{ artifactId: 'a1', parts: [{ text: 'Contact ***, key token=***' }] }],
      count: 2,
    });
    expect(out).toEqual(redactValue(answer));
    expect(JSON.stringify(out)).not.toContain('alice@example.com');
  });

  it('metadata keeps a content-free summary', () => {
    const out = applyLevel('metadata', answer);
    expect(out).toEqual(summarizeValue(answer));
    expect(out).toMatchObject({ kind: 'object', count: 2, keys: ['artifacts', 'count'] });
    expect(JSON.stringify(out)).not.toContain('Contact');
  });

  it('none keeps nothing', () => {
    expect(applyLevel('none', answer)).toBeUndefined();
  });

  it.each(ORDER)('%s never mutates the input', (level) => {
    const input = structuredClone(answer);
    applyLevel(level, input);
    expect(input).toEqual(answer);
  });

  it.each(['strict', 'FULL', '', undefined, null, 3])('throws on the invalid level %j', (level) => {
    expect(() => applyLevel(level as PrivacyLevel, answer)).toThrow(TypeError);
  });

  it('each level keeps what a looser level keeps, minus content', () => {
    const text = 'mail bob@example.com with Bearer abc.123 and plain words';
    const kept = (level: PrivacyLevel): string => JSON.stringify(applyLevel(level, text) ?? null);
    expect(kept('full')).toContain('bob@example.com');
    expect(kept('redacted')).toBe(JSON.stringify('mail *** with Bearer *** and plain words'));
    expect(kept('metadata')).toBe(JSON.stringify({ kind: 'text', length: text.length }));
    expect(kept('none')).toBe('null');
  });

  it('is typed so that callers know what each level yields', () => {
    const value = { a: 1 };
    expectTypeOf(applyLevel('none', value)).toEqualTypeOf<undefined>();
    expectTypeOf(applyLevel('metadata', value)).toEqualTypeOf<ValueSummary>();
    expectTypeOf(applyLevel('full', value)).toEqualTypeOf<{ a: number }>();
    expectTypeOf(applyLevel('redacted', value)).toEqualTypeOf<unknown>();
    const dynamic = 'full' as PrivacyLevel;
    expectTypeOf(applyLevel(dynamic, value)).toEqualTypeOf<unknown>();
  });
});

describe('scrubToCeiling (all 4x4 stored level x ceiling)', () => {
  const pairs = ORDER.flatMap((stored) => ORDER.map((ceiling): [PrivacyLevel, PrivacyLevel] => [stored, ceiling]));

  it.each(pairs)('stored at %s, ceiling %s', (stored, ceiling) => {
    const storedValue = applyLevel(stored, answer);
    const result = scrubToCeiling(stored, ceiling, storedValue);
    if (rank(ceiling) >= rank(stored)) {
      // Not stricter: nothing changes, nothing is loosened or summarized twice.
      expect(result.level).toBe(stored);
      expect(result.value).toBe(storedValue);
    } else {
      expect(result.level).toBe(ceiling);
      expect(result.value).toEqual(applyLevel(ceiling, storedValue));
    }
  });

  it('scrubbing a full answer to metadata leaves no content', () => {
    const { level, value } = scrubToCeiling('full', 'metadata', answer);
    expect(level).toBe('metadata');
    expect(JSON.stringify(value)).not.toContain('alice');
  });

  it('scrubbing to none stores nothing', () => {
    expect(scrubToCeiling('redacted', 'none', redactValue(answer))).toEqual({ level: 'none', value: undefined });
  });
});
