/**
 * The two privacy ceilings of a run (docs/architecture.md, "Privacy").
 *
 * - `auditLevel` bounds run events (the audit trail: prompts, tool calls, provider output).
 * - `answerLevel` bounds answers, task results and `Task.history`.
 *
 * Both start from the global `privacy.level` (default `metadata`). For answers, a global `metadata`
 * keeps a full answer: the default installation keeps a content-free audit trail but can still return
 * what its agents answered. Any other global level (`none`, `redacted`, `full`) is the answer base as
 * it is. A provider and an agent (publication profile) may then tighten either ceiling, never loosen.
 */
import {
  DEFAULT_PRIVACY_LEVEL,
  assertPrivacyLevel,
  compareLevels,
  tightenOnly,
  type PrivacyLevel,
} from './privacy-level.js';

/** What a provider or an agent may set (config `privacy: { auditLevel?, answerLevel? }`). */
export type CeilingOverrides = {
  auditLevel?: PrivacyLevel | undefined;
  answerLevel?: PrivacyLevel | undefined;
};

export type CeilingInput = {
  /** The global `privacy.level`; absent means `metadata`. */
  global?: PrivacyLevel | undefined;
  provider?: CeilingOverrides | undefined;
  agent?: CeilingOverrides | undefined;
};

export type Ceilings = { auditLevel: PrivacyLevel; answerLevel: PrivacyLevel };

/** The answer base for a global level: `metadata` keeps a full answer, the others stay as they are. */
export function answerBaseLevel(global: PrivacyLevel): PrivacyLevel {
  assertPrivacyLevel(global, 'global privacy level');
  return global === 'metadata' ? 'full' : global;
}

/**
 * Resolves the ceilings of a run for one provider attempt. The order of provider and agent does not
 * matter (tightening is a minimum). Unknown level strings throw instead of being guessed.
 */
export function resolveCeilings(input: CeilingInput): Ceilings {
  const global = input.global ?? DEFAULT_PRIVACY_LEVEL;
  assertPrivacyLevel(global, 'global privacy level');
  let auditLevel: PrivacyLevel = global;
  let answerLevel: PrivacyLevel = answerBaseLevel(global);
  for (const [who, overrides] of [
    ['provider', input.provider],
    ['agent', input.agent],
  ] as const) {
    if (overrides === undefined) continue;
    if (overrides.auditLevel !== undefined) assertPrivacyLevel(overrides.auditLevel, `${who} auditLevel`);
    if (overrides.answerLevel !== undefined) assertPrivacyLevel(overrides.answerLevel, `${who} answerLevel`);
    auditLevel = tightenOnly(auditLevel, overrides.auditLevel);
    answerLevel = tightenOnly(answerLevel, overrides.answerLevel);
  }
  return { auditLevel, answerLevel };
}

/**
 * Combines the ceilings a run already has with those resolved for a later provider attempt (a
 * fallback): each ceiling only tightens, so switching providers never widens what the run keeps.
 */
export function tightenCeilings(current: Ceilings, next: Ceilings): Ceilings {
  return {
    auditLevel: tightenOnly(current.auditLevel, next.auditLevel),
    answerLevel: tightenOnly(current.answerLevel, next.answerLevel),
  };
}

/**
 * Whether an answer can be kept at this answer ceiling. A2A needs the result of a COMPLETED task to be
 * stored; at `metadata` or `none` it cannot be, so such a publication profile is refused with
 * RESULT_NOT_RETAINABLE before any task exists, and a fallback that tightens to them fails the task.
 */
export function answerIsRetainable(level: PrivacyLevel): boolean {
  return compareLevels(level, 'redacted') >= 0;
}

/**
 * True when `after` is strictly stricter than `before`: the moment answers already stored for the run
 * must be scrubbed to the new level (in the same transaction that changes the ceiling).
 */
export function ceilingTightened(before: PrivacyLevel, after: PrivacyLevel): boolean {
  return compareLevels(after, before) < 0;
}
