import { GetTaskRequest } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { z } from 'zod';
import type { KeelContext } from '../runtime/keel-context.js';
import { enqueueRun } from '../runs/create-agent-run.js';
import { claimForResume, HANDOFF_PREFIX, suspendedStateContext } from '../runs/run-repository.js';
import { HANDOFF_LEASE_MS } from '../runs/resume-run.js';
import type { LoopState } from '../../machines/agent-loop.machine.js';
import { acknowledgeDependency, callbackBodyContext, databaseNow, dependencyResult, getDependency, markCallbacksProcessed, resolveDependency, schedulePoll, type DependencyRow } from './dependency-repository.js';
import type { RemoteAgents } from './remote-agents.js';
import { judgeRemoteTask, type SdkTask } from './remote-task.js';
import { randomBytes } from 'node:crypto';

// Reconciliation: the callback body decides nothing. Keel asks the remote for the task (GetTask,
// as the agent's owning client) and acts on that answer. Resolution is one guarded update and the
// run resumes through one guarded claim (two statements, each guarded), so duplicates, late
// callbacks, a callback racing the poller, or two workers resolve and resume once; a run left
// waiting between the two (a crash) is handed over again by the poller.

export type ReconcileOutcome = 'resolved' | 'failed' | 'waiting' | 'not_ready' | 'already_done' | 'unreachable';

/** The default of `inbox.unacknowledgedGiveUpSeconds`. */
const PENDING_GIVE_UP_MS = 10 * 60_000;

/** Poll backoff: min(2 s × 2^polls, 5 min). */
export const pollDelayMs = (polls: number) => Math.min(5 * 60_000, 2000 * 2 ** Math.min(polls, 10));

const runState = z.object({ status: z.string(), revision: z.number(), suspended_state: z.instanceof(Buffer).nullable() });

export async function reconcileDependency(
  context: Pick<KeelContext, 'pool' | 'sealer' | 'queues' | 'logger'> & { config?: Pick<KeelContext['config'], 'inbox'> },
  remotes: RemoteAgents,
  dependencyId: string,
): Promise<ReconcileOutcome> {
  let dependency = await getDependency(context.pool, dependencyId);
  if (!dependency) return 'already_done';
  if (dependency.state === 'resolved' || dependency.state === 'failed') {
    await markCallbacksProcessed(context.pool, dependencyId);
    return (await resumeIfWaiting(context, dependency)) ? dependency.state : 'already_done';
  }
  if (dependency.state === 'pending' || !dependency.remote_task_id) dependency = (await adoptRemoteTask(context, dependency)) ?? dependency;
  if (dependency.state === 'pending' || !dependency.remote_task_id) {
    // A callback before the remote task id is known is kept; it is reconciled once the id is
    // stored. A message never acknowledged (the sender crashed mid-send) fails after a while.
    const giveUpMs = context.config ? context.config.inbox.unacknowledgedGiveUpSeconds * 1000 : PENDING_GIVE_UP_MS;
    if (Date.now() - dependency.created_at > giveUpMs) {
      await resolveDependency(context.pool, context.sealer, dependencyId, 'FAILED', 'not_acknowledged', JSON.stringify({ state: 'failed', message: 'the remote agent never acknowledged the message' }));
      await resumeIfWaiting(context, { ...dependency, state: 'failed', outcome: 'not_acknowledged' });
      return 'failed';
    }
    await schedulePoll(context.pool, dependencyId, 1000);
    return 'not_ready';
  }
  const lookup = await remotes.get(dependency.remote_agent);
  if (!lookup.ok) {
    await schedulePoll(context.pool, dependencyId, pollDelayMs(dependency.polls));
    return 'unreachable';
  }
  // Callbacks received before this instant are answered by the GetTask below; one received later
  // (the remote may have finished since) must not be marked processed by a WORKING answer.
  const asOf = await databaseNow(context.pool);
  let task: SdkTask;
  try {
    task = (await lookup.remote.client.getTask(GetTaskRequest.fromJSON({ id: dependency.remote_task_id, historyLength: 0 }))) as SdkTask;
  } catch (error) {
    context.logger.warn({ err: error, dependencyId }, 'GetTask on the remote failed; polling later');
    await schedulePoll(context.pool, dependencyId, pollDelayMs(dependency.polls));
    return 'unreachable';
  }
  const verdict = judgeRemoteTask(task);
  if (verdict.kind === 'waiting') {
    const later = await markCallbacksProcessed(context.pool, dependencyId, asOf);
    // A callback that arrived during the GetTask found this job active and enqueued nothing: poll again at once.
    await schedulePoll(context.pool, dependencyId, later > 0 ? 0 : pollDelayMs(dependency.polls));
    return 'waiting';
  }
  const resolved = await resolveDependency(
    context.pool,
    context.sealer,
    dependencyId,
    verdict.kind === 'resolved' ? 'RESOLVED' : 'FAILED',
    verdict.kind === 'resolved' ? 'completed' : verdict.outcome,
    verdict.result,
  );
  await markCallbacksProcessed(context.pool, dependencyId);
  if (!resolved) return 'already_done';
  const fresh = await getDependency(context.pool, dependencyId);
  await resumeIfWaiting(context, fresh ?? dependency, verdict.result);
  return verdict.kind;
}

const callbackRow = z.object({ id: z.string(), body: z.instanceof(Buffer) });

/**
 * A sender that died after its message went out never stored the remote task id, and the run
 * retried after it waits on the same pending dependency. The remote's callbacks reach this
 * dependency's own registration, whose credential went out only in that message: the task they
 * name is the one it created. Its id is adopted (a guarded pending → waiting, as the sender would
 * have); its state still comes from GetTask, never from the callback.
 */
async function adoptRemoteTask(context: Pick<KeelContext, 'pool' | 'sealer'>, dependency: DependencyRow): Promise<DependencyRow | null> {
  const callback = await context.pool.maybeOne(sql.type(callbackRow)`
    SELECT c.id, c.body FROM inbox_callbacks c JOIN inbox_registrations r ON r.id = c.registration_id
    WHERE r.dependency_id = ${dependency.id} ORDER BY c.received_at DESC LIMIT 1`);
  if (!callback) return null;
  const opened = context.sealer.openJson<Record<string, { id?: unknown; taskId?: unknown; contextId?: unknown } | undefined>>(callbackBodyContext(callback.id), callback.body);
  if (!opened.ok) return null;
  const { task, statusUpdate, artifactUpdate } = opened.value;
  const taskId = task?.id ?? statusUpdate?.taskId ?? artifactUpdate?.taskId;
  const contextId = task?.contextId ?? statusUpdate?.contextId ?? artifactUpdate?.contextId;
  if (typeof taskId !== 'string' || taskId === '') return null;
  await acknowledgeDependency(context.pool, dependency.id, taskId, typeof contextId === 'string' ? contextId : null);
  return getDependency(context.pool, dependency.id);
}

/**
 * Hands the run its tool result: one guarded claim from waiting_for_dependency, bound to the
 * revision read. A run not waiting yet (its suspension still committing) is resumed by the
 * reconcile the executor enqueues right after it suspends.
 */
async function resumeIfWaiting(context: Pick<KeelContext, 'pool' | 'sealer' | 'queues'>, dependency: DependencyRow, knownResult?: string): Promise<boolean> {
  const run = await context.pool.maybeOne(sql.type(runState)`SELECT status, revision, suspended_state FROM runs WHERE id = ${dependency.run_id}`);
  if (!run || run.status !== 'waiting_for_dependency' || !run.suspended_state) return false;
  const opened = context.sealer.openJson<LoopState>(suspendedStateContext(dependency.run_id), run.suspended_state);
  if (!opened.ok || opened.value.pendingDependency?.dependencyId !== dependency.id) return false;
  let result = knownResult;
  result ??= (await dependencyResult(context.pool, context.sealer, dependency.id)) ?? JSON.stringify({ state: dependency.outcome ?? 'failed' });
  const claimed = await claimForResume(
    context.pool,
    dependency.run_id,
    'waiting_for_dependency',
    { workerId: `${HANDOFF_PREFIX}${randomBytes(8).toString('hex')}`, leaseMs: HANDOFF_LEASE_MS },
    run.revision,
    { sealer: context.sealer, state: { ...opened.value, resume: { kind: 'tool_result', toolCallId: dependency.tool_call_id, toolName: dependency.tool_name, content: result } } },
  );
  if (claimed) await enqueueRun(context.queues, dependency.run_id);
  return claimed !== null;
}
