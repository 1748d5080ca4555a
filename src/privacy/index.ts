/**
 * The privacy library (docs/architecture.md, "Privacy"): levels, ceilings, redaction, summaries.
 * Pure: no I/O, no clock, no randomness, so every rule here is unit-tested exhaustively.
 */
export {
  PRIVACY_LEVELS,
  DEFAULT_PRIVACY_LEVEL,
  isPrivacyLevel,
  assertPrivacyLevel,
  compareLevels,
  isStricter,
  strictestLevel,
  tightenOnly,
  type PrivacyLevel,
} from './privacy-level.js';
export {
  resolveCeilings,
  answerBaseLevel,
  tightenCeilings,
  answerIsRetainable,
  ceilingTightened,
  type CeilingOverrides,
  type CeilingInput,
  type Ceilings,
} from './resolve-ceilings.js';
export { MASK, CREDENTIAL_QUERY_KEYS, REDACTION_RULES, redactText, redactValue } from './redact.js';
export {
  SUMMARY_LIMITS,
  SUMMARY_ROLES,
  summaryName,
  summaryMediaType,
  base64ByteLength,
  summarizeValue,
  summarizePart,
  summarizeParts,
  summarizeToolCall,
  summarizeToolCalls,
  summarizeMessage,
  type ValueSummary,
  type PartSummary,
  type ToolCallSummary,
  type MessageSummary,
  type SummaryRole,
} from './summarize.js';
export { applyLevel, scrubToCeiling, type LeveledValue } from './apply-level.js';
