// Deterministic job ids: a job is only a wake-up, and the same debt always maps to the same id, so
// enqueueing twice is harmless. BullMQ refuses ':' in custom ids, hence '-' as the separator
// (docs/decisions/0004-job-ids-without-colons.md).
// A requeued run gets a job id of its own (`run-<id>-r<n>`): the job of the worker that crashed
// stays 'active' in BullMQ until its lock expires and stall detection runs (30-60 s), and under the
// same id it would hide the requeue's wake-up until then.
export const runJobId = (runId: string, requeues = 0) => (requeues > 0 ? `run-${runId}-r${requeues}` : `run-${runId}`);
/**
 * A resume handed to a worker (claimed 'handoff:…' at `revision`) wakes the run under an id of its
 * own: the job of the stretch that suspended is still 'active' (or waiting for a retry) under the
 * run's usual id for a moment after the suspension committed, and a follow-up answered within that
 * moment would otherwise be dropped as a duplicate and wait for the sweeper.
 */
export const handoffJobId = (runId: string, revision: number) => `run-${runId}-h${revision}`;
/** An operator's retry of a failed run (queued again at `revision`): a wake-up of its own, never the finished job of an earlier stretch. */
export const retryJobId = (runId: string, revision: number) => `run-${runId}-x${revision}`;
/** A statechart run's durable timer (waiting_for_timer since `revision`): a delayed job wakes it at its due time. */
export const timerJobId = (runId: string, revision: number) => `run-${runId}-t${revision}`;
export const projectionJobId = (runId: string, revision: number) => `proj-${runId}-${revision}`;
/** One job per attempt: a retry is a new delayed job, never the finished one re-added. */
export const deliveryJobId = (deliveryId: string, attempt = 0) => (attempt > 0 ? `dlv-${deliveryId}-a${attempt}` : `dlv-${deliveryId}`);
export const inboxJobId = (inboxId: string) => `inbox-${inboxId}`;
