/**
 * Applying a privacy level to a value before it is stored (docs/architecture.md, "Privacy").
 * `none` yields `undefined` rather than an empty value, so that the caller stores no row at all.
 */
import { assertPrivacyLevel, isStricter, type PrivacyLevel } from './privacy-level.js';
import { redactValue } from './redact.js';
import { summarizeValue, type ValueSummary } from './summarize.js';

/**
 * What `applyLevel` returns for a level known at compile time: `none` yields `undefined`, so a caller
 * cannot mistake "nothing kept" for a value; for a level only known at run time (`PrivacyLevel`) the
 * result is the union of the four, i.e. `unknown`.
 */
export type LeveledValue<L extends PrivacyLevel, T> = L extends 'none'
  ? undefined
  : L extends 'metadata'
    ? ValueSummary
    : L extends 'redacted'
      ? unknown
      : T;

export function applyLevel<L extends PrivacyLevel, T>(level: L, value: T): LeveledValue<L, T> {
  // A level read from a row or a config at run time may be anything; refuse rather than keep too much.
  assertPrivacyLevel(level);
  switch (level as PrivacyLevel) {
    case 'full':
      return value as LeveledValue<L, T>;
    case 'redacted':
      return redactValue(value) as LeveledValue<L, T>;
    case 'metadata':
      return summarizeValue(value) as LeveledValue<L, T>;
    case 'none':
      return undefined as LeveledValue<L, T>;
  }
}

/**
 * Scrubs a value already stored at `storedLevel` to a (possibly tightened) ceiling: used when the
 * answer ceiling of a run tightens and its stored answers must follow in the same transaction.
 * A ceiling that is not stricter changes nothing (a stored summary is never summarized again, and
 * nothing is ever loosened); otherwise the ceiling's level is applied to the stored value.
 */
export function scrubToCeiling(
  storedLevel: PrivacyLevel,
  ceiling: PrivacyLevel,
  storedValue: unknown,
): { level: PrivacyLevel; value: unknown } {
  if (!isStricter(ceiling, storedLevel)) return { level: storedLevel, value: storedValue };
  return { level: ceiling, value: applyLevel(ceiling, storedValue) };
}
