import type { TerminationReason } from '../../machines/run.machine.js';
import type { Message } from '../protocol/wire.js';
import { approvalTimedOutText } from '../runs/approval-timeout.js';
import { artifactTooLargeText } from '../runs/artifact-limit.js';

// The one place that turns how a run ended into what its task's status says (message text and
// metadata): GetTask's view (taskView) and the journal's status event (the projector) both take
// it from here.

const FAILURE_MESSAGES: Partial<Record<TerminationReason, string>> = {
  result_not_retainable: "the result could not be kept under this installation's privacy policy",
  policy_denied: 'the request was declined by a policy of this agent',
  approval_denied: 'an operator did not approve the request',
  provider_failed: 'the model provider failed; the request may be retried',
  not_retryable: 'the request could not be processed',
  retries_exhausted: 'the run was interrupted too often and was stopped',
  cancelled: 'the task was cancelled',
};

/**
 * The text of a FAILED (or REJECTED, CANCELED) status without a message of the agent's: the
 * termination reason's, made precise by the run's failure detail where that names a cause.
 */
export function failureText(reason: TerminationReason, failureDetail: Record<string, unknown> | null): string {
  if (failureDetail?.rejected === true) return 'the agent rejected the task';
  switch (failureDetail?.reason) {
    case 'approval_timed_out':
      if (typeof failureDetail.timeoutHours === 'number') return approvalTimedOutText(failureDetail.timeoutHours);
      break;
    case 'suspension_not_stored':
      return 'the approval this request needs could not be recorded';
    case 'result_not_stored':
      return 'the result could not be stored';
    case 'artifact_too_large':
      return artifactTooLargeText(failureDetail);
    // A statechart agent's run (docs/statechart-agents.md).
    case 'machine_version':
      return `the agent's machine changed while this task was in flight: its state "${String(failureDetail.state)}" is not in the current version (${String(failureDetail.current)}); the task started with version ${String(failureDetail.startedWith)}`;
    case 'machine_error': {
      // A step's error: its class always; its message is the status message the run wrote where
      // the audit level keeps it, and where it does not, this says so and names the setting.
      const stopped = `the agent's machine stopped: ${String(failureDetail.error)}`;
      if (typeof failureDetail.errorClass !== 'string') return stopped;
      const notKept = failureDetail.messageNotKept;
      return typeof notKept === 'string' ? `${stopped}: ${failureDetail.errorClass} (${notKept})` : `${stopped}: ${failureDetail.errorClass}`;
    }
  }
  return FAILURE_MESSAGES[reason] ?? `the task ended: ${reason}`;
}

/** The agent's status message of a task whose run ended without a message of its own. */
export function failureStatusMessage(
  task: { id: string; contextId: string },
  messageId: string,
  reason: TerminationReason,
  failureDetail: Record<string, unknown> | null,
): Message {
  return { messageId, role: 'ROLE_AGENT', parts: [{ text: failureText(reason, failureDetail) }], contextId: task.contextId, taskId: task.id };
}

/** The metadata a task's status carries for its termination reason (A2A has no state for it). */
export function failureMetadata(reason: TerminationReason | null): Record<string, string> | null {
  return reason === 'result_not_retainable' ? { reason: 'RESULT_NOT_RETAINABLE' } : null;
}
