import { describe, it, expect } from 'vitest';
import * as privacy from '../../../src/privacy/index.js';

describe('src/privacy/index.ts', () => {
  it('re-exports the public API', () => {
    const expected = [
      'PRIVACY_LEVELS',
      'DEFAULT_PRIVACY_LEVEL',
      'isPrivacyLevel',
      'assertPrivacyLevel',
      'compareLevels',
      'isStricter',
      'strictestLevel',
      'tightenOnly',
      'resolveCeilings',
      'answerBaseLevel',
      'tightenCeilings',
      'answerIsRetainable',
      'ceilingTightened',
      'MASK',
      'CREDENTIAL_QUERY_KEYS',
      'REDACTION_RULES',
      'redactText',
      'redactValue',
      'SUMMARY_LIMITS',
      'SUMMARY_ROLES',
      'summaryName',
      'summaryMediaType',
      'base64ByteLength',
      'summarizeValue',
      'summarizePart',
      'summarizeParts',
      'summarizeToolCall',
      'summarizeToolCalls',
      'summarizeMessage',
      'applyLevel',
      'scrubToCeiling',
    ];
    expect(Object.keys(privacy).sort()).toEqual([...expected].sort());
  });

  it('works end to end: resolve the ceilings, then apply them', () => {
    const { auditLevel, answerLevel } = privacy.resolveCeilings({ global: 'metadata', provider: { answerLevel: 'redacted' } });
    expect(privacy.answerIsRetainable(answerLevel)).toBe(true);
    expect(privacy.applyLevel(answerLevel, 'reach me at a@example.com')).toBe('reach me at ***');
    expect(privacy.applyLevel(auditLevel, 'reach me at a@example.com')).toEqual({ kind: 'text', length: 25 });
  });
});
