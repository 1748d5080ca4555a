import type { GuardrailStage } from '../config/config-schema.js';

export type { GuardrailStage };

/** A check on the input or on an answer. Its reason comes from configuration, never from the text. */
export type GuardrailDecision = { verdict: 'allow' } | { verdict: 'deny'; reason: string } | { verdict: 'requireApproval'; reason: string };

export type GuardrailCheck = { stage: GuardrailStage; text: string; runId: string; agentId: string };

export type Guardrail = {
  name: string;
  stages: readonly GuardrailStage[];
  check: (input: GuardrailCheck) => Promise<GuardrailDecision>;
};

export type GuardrailVerdict =
  | { verdict: 'allow' }
  | { verdict: 'deny'; guardrail: string; reason: string }
  | { verdict: 'requireApproval'; guardrail: string; reason: string };

/** Whether any of the guardrails checks each stage: a stage none checks is allowed without a check. */
export function guardedStagesOf(guardrails: readonly Guardrail[]): { input: boolean; answer: boolean } {
  return {
    input: guardrails.some((guardrail) => guardrail.stages.includes('input')),
    answer: guardrails.some((guardrail) => guardrail.stages.includes('answer')),
  };
}

/**
 * Runs every guardrail of the stage. A deny wins over a required approval, which wins over allow;
 * a guardrail that throws or answers nonsense denies (fail closed).
 */
export async function evaluateGuardrails(guardrails: readonly Guardrail[], check: GuardrailCheck): Promise<GuardrailVerdict> {
  let approval: GuardrailVerdict | null = null;
  for (const guardrail of guardrails) {
    if (!guardrail.stages.includes(check.stage)) continue;
    let decision: GuardrailDecision;
    try {
      decision = await guardrail.check(check);
    } catch {
      return { verdict: 'deny', guardrail: guardrail.name, reason: 'the guardrail failed to decide' };
    }
    if (decision?.verdict === 'deny') return { verdict: 'deny', guardrail: guardrail.name, reason: decision.reason };
    if (decision?.verdict === 'requireApproval') {
      approval ??= { verdict: 'requireApproval', guardrail: guardrail.name, reason: decision.reason };
    } else if (decision?.verdict !== 'allow') {
      return { verdict: 'deny', guardrail: guardrail.name, reason: 'the guardrail gave no valid verdict' };
    }
  }
  return approval ?? { verdict: 'allow' };
}
