/**
 * Privacy levels (docs/architecture.md, "Privacy").
 *
 * Strictest first: `none` < `metadata` < `redacted` < `full`.
 * - `none`: nothing is stored.
 * - `metadata`: kinds, counts, lengths and names; no content.
 * - `redacted`: the content with secrets masked as `***`.
 * - `full`: the content as it is.
 *
 * "Stricter" always means "keeps less". Every combinator here moves towards the stricter side, so a
 * bug in a caller can make Keel keep too little, never too much.
 */

/** All levels, ordered strictest first; the index is the rank. */
export const PRIVACY_LEVELS = ['none', 'metadata', 'redacted', 'full'] as const;

export type PrivacyLevel = (typeof PRIVACY_LEVELS)[number];

/** The global `privacy.level` when the config does not set one. */
export const DEFAULT_PRIVACY_LEVEL: PrivacyLevel = 'metadata';

const RANK: Readonly<Record<PrivacyLevel, number>> = { none: 0, metadata: 1, redacted: 2, full: 3 };

export function isPrivacyLevel(x: unknown): x is PrivacyLevel {
  // Own-property check: 'toString' or '__proto__' must not pass as a level.
  return typeof x === 'string' && Object.prototype.hasOwnProperty.call(RANK, x);
}

/**
 * Throws on anything that is not a level. Levels come from config and from stored rows; an unknown
 * value there is a bug or a tampered row, and guessing a level for it could keep too much.
 */
export function assertPrivacyLevel(x: unknown, what = 'privacy level'): asserts x is PrivacyLevel {
  if (!isPrivacyLevel(x)) {
    throw new TypeError(`invalid ${what}: ${JSON.stringify(x)} (expected one of ${PRIVACY_LEVELS.join(', ')})`);
  }
}

/** Negative when `a` is stricter than `b`, zero when equal, positive when `a` is looser (sort order). */
export function compareLevels(a: PrivacyLevel, b: PrivacyLevel): number {
  assertPrivacyLevel(a);
  assertPrivacyLevel(b);
  return RANK[a] - RANK[b];
}

/** True when `a` keeps strictly less than `b`. */
export function isStricter(a: PrivacyLevel, b: PrivacyLevel): boolean {
  return compareLevels(a, b) < 0;
}

/**
 * The strictest of the given levels (their minimum). At least one level is required by the type:
 * the minimum of nothing would be `full`, the wrong default for a privacy ceiling.
 */
export function strictestLevel(first: PrivacyLevel, ...rest: readonly PrivacyLevel[]): PrivacyLevel {
  let result = first;
  assertPrivacyLevel(result);
  for (const level of rest) {
    if (compareLevels(level, result) < 0) result = level;
  }
  return result;
}

/**
 * Applies a requested level to a current ceiling: the result is the stricter of the two, so a request
 * can tighten a ceiling but never loosen it. `undefined` (nothing requested) keeps the current level.
 */
export function tightenOnly(current: PrivacyLevel, requested: PrivacyLevel | undefined): PrivacyLevel {
  assertPrivacyLevel(current);
  if (requested === undefined) return current;
  return compareLevels(requested, current) < 0 ? requested : current;
}
