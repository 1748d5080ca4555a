import { compareLevels, type PrivacyLevel } from '../privacy/privacy-level.js';
import { redactText } from '../privacy/redact.js';

// What a statechart run that ended on a step's unhandled error records of that error
// (docs/statechart-agents.md, "Diagnosing"; decision 0073): its class always (a name from the
// team's code, like a tool's name), its message only where the run's audit level keeps content
// (masked at `redacted`), and where it does not, a line that says so and names the setting that
// keeps it. The same text is the failed task's status message, for the client.

/** A step's error as the machine got it: the class of what was thrown, and its message. */
export type StepError = { errorClass: string; message: string };

/**
 * The setting that keeps an error's message for an agent: its own `privacy.auditLevel` when that
 * is what keeps none, else the installation's `privacy.level`.
 */
export function errorTextSetting(agentId: string, agentAuditLevel: PrivacyLevel | undefined): string {
  return agentAuditLevel !== undefined && !keepsErrorText(agentAuditLevel) ? `privacy.auditLevel of agent ${agentId}` : 'privacy.level';
}

/** The class of a thrown value: a subclass's own name even when it left `name` as "Error". */
export function errorClassOf(error: unknown): string {
  if (error instanceof Error) return error.name !== 'Error' ? error.name : error.constructor?.name || 'Error';
  if (error === null) return 'null';
  return typeof error;
}

/** A step's error from the value a machine's error event carries (an Error, or `{ message, name? }` as Keel's steps give it). */
export function stepErrorOf(value: unknown): StepError {
  if (value instanceof Error) return { errorClass: errorClassOf(value), message: value.message };
  if (typeof value === 'object' && value !== null) {
    const { message, name } = value as { message?: unknown; name?: unknown };
    return { errorClass: typeof name === 'string' && name !== '' ? name : 'Error', message: typeof message === 'string' ? message : (JSON.stringify(value) ?? '') };
  }
  return { errorClass: errorClassOf(value), message: String(value) };
}

/** Whether the audit level keeps an error's message (as it is, or masked). */
export const keepsErrorText = (level: PrivacyLevel): boolean => compareLevels(level, 'redacted') >= 0;

/** The line shown where the message was not kept: why, and what keeps it. */
export const errorTextNotKept = (level: PrivacyLevel, setting: string): string =>
  `its message is not kept at audit level ${level}: set ${setting} to redacted or full to keep it (an agent's or a provider's privacy.auditLevel can only lower the installation's)`;

/** The message as the level keeps it, or null where it keeps none. */
export function keptErrorText(level: PrivacyLevel, error: StepError): string | null {
  if (!keepsErrorText(level)) return null;
  return level === 'full' ? error.message : redactText(error.message);
}

/** What failed: "step pay failed and no transition handles its error". */
export const stepFailureWhat = (step: string | null): string =>
  step === null ? 'the machine stopped on an error no transition handles' : `step ${step} failed and no transition handles its error`;

/** "step pay failed …: CardDeclined: card declined", where the level keeps the message; null where it keeps none. */
export function stepFailureText(level: PrivacyLevel, step: string | null, error: StepError): string | null {
  const kept = keptErrorText(level, error);
  return kept === null ? null : `${stepFailureWhat(step)}: ${error.errorClass}: ${kept}`;
}
