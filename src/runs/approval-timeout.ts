import type { DatabasePool } from 'slonik';
import type { KeelLogger } from '../log/logger.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { projectionJobId } from '../queue/job-ids.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import { auditPayload } from './audit-trail.js';
import { appendRunEvent } from './run-event-repository.js';
import { listApprovalsPastTimeout, timeOutApproval } from './run-repository.js';
import { recordRunEndedOutsideWorker } from '../tracing/ended-run-span.js';

// An approval nobody decides ends the run after `runs.approvalTimeoutHours` (a required approval
// that is never given ends `approval_denied`). The maintenance sweep applies it.

/** What the run's timeline and its task's FAILED status say. */
export function approvalTimedOutText(timeoutHours: number): string {
  return `approval timed out after ${timeoutHours} h`;
}

const BATCH = 1000;

/**
 * Ends every run that has waited for an approval longer than `timeoutHours`: one guarded transition
 * per run with its timeline event in the same transaction, then the projection of its task (the
 * FAILED status into the journal, like any terminal transition). Returns how many runs ended.
 */
export async function timeOutApprovals(
  context: { pool: DatabasePool; queues: KeelQueues; logger: KeelLogger },
  timeoutHours: number,
): Promise<number> {
  const due = await listApprovalsPastTimeout(context.pool, timeoutHours, BATCH);
  let ended = 0;
  for (const runId of due) {
    const run = await context.pool.transaction(async (transaction) => {
      const failed = await timeOutApproval(transaction, runId, timeoutHours);
      if (!failed) return null;
      const payload = auditPayload(failed.audit_level as PrivacyLevel, {
        kind: 'approval_timed_out',
        meta: { message: approvalTimedOutText(timeoutHours), timeoutHours },
      });
      if (payload !== null) await appendRunEvent(transaction, runId, 'approval_timed_out', payload);
      return failed;
    });
    // Decided or cancelled between the listing and the guarded write: not this sweep's any more.
    if (!run) continue;
    ended += 1;
    recordRunEndedOutsideWorker(run, 'approval_timed_out');
    context.logger.notice({ runId, agent: run.agent, timeoutHours }, 'run failed: its approval timed out');
    if (run.task_id !== null) await context.queues.ensureJob('projector', projectionJobId(runId, run.revision), { runId });
  }
  return ended;
}
