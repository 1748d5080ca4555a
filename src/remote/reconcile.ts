import { CancelTaskRequest, GetTaskRequest } from '@a2a-js/sdk';
import { context as otelContext } from '@opentelemetry/api';
import { sql } from 'slonik';
import { z } from 'zod';
import type { KeelContext } from '../context/keel-context.js';
import { claimForResume, getRunTrace, HANDOFF_PREFIX, suspendedStateContext } from '../runs/run-repository.js';
import { enqueueHandOff, HANDOFF_LEASE_MS } from '../runs/resume-run.js';
import type { LoopState } from '../../machines/agent-loop.machine.js';
import { TaskNotCancelableError, TaskNotFoundError } from '@a2a-js/sdk/errors';
import { recordEndedRunEvent } from '../runs/run-event-repository.js';
import { runContext } from '../tracing/run-trace.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';
import {
  acknowledgeDependency,
  callbackBodyContext,
  databaseNow,
  dependencyResult,
  getDependency,
  markCallbacksProcessed,
  markCallbacksProcessedById,
  resolveDependency,
  schedulePoll,
  unprocessedCallbacks,
  type DependencyRow,
} from './dependency-repository.js';
import type { RemoteAgent, RemoteAgents } from './remote-agents.js';
import { createdByMessage, judgeRemoteTask, type SdkTask } from './remote-task.js';
import { randomBytes } from 'node:crypto';

// Reconciliation: the callback body decides nothing. Keel asks the remote for the task (GetTask,
// as the agent's owning client) and acts on that answer. Resolution is one guarded update and the
// run resumes through one guarded claim (two statements, each guarded), so duplicates, late
// callbacks, a callback racing the poller, or two workers resolve and resume once; a run left
// waiting between the two (a crash) is handed over again by the poller.

export type ReconcileOutcome = 'resolved' | 'failed' | 'waiting' | 'not_ready' | 'already_done' | 'unreachable' | 'cancelled';

/** The default of `inbox.unacknowledgedGiveUpSeconds`. */
const PENDING_GIVE_UP_MS = 10 * 60_000;

/** Poll backoff: min(2 s × 2^polls, 5 min). */
export const pollDelayMs = (polls: number) => Math.min(5 * 60_000, 2000 * 2 ** Math.min(polls, 10));

const runState = z.object({ status: z.string(), revision: z.number(), suspended_state: z.instanceof(Buffer).nullable() });

type ReconcileContext = Pick<KeelContext, 'pool' | 'sealer' | 'queues' | 'logger'> & { config?: Pick<KeelContext['config'], 'inbox'> };

export async function reconcileDependency(context: ReconcileContext, remotes: RemoteAgents, dependencyId: string): Promise<ReconcileOutcome> {
  const dependency = await getDependency(context.pool, dependencyId);
  if (!dependency) return 'already_done';
  if (!tracingEnabled()) return reconcileFound(context, remotes, dependency);
  // The remote calls a reconcile makes (GetTask, CancelTask) belong to the trace of the run that
  // waits on them, under its run span, like the call that started the remote task: not traces
  // of their own.
  const run = await getRunTrace(context.pool, dependency.run_id);
  return otelContext.with(run ? runContext(run) : otelContext.active(), () => reconcileFound(context, remotes, dependency));
}

async function reconcileFound(context: ReconcileContext, remotes: RemoteAgents, found: DependencyRow): Promise<ReconcileOutcome> {
  let dependency = found;
  const dependencyId = found.id;
  if (dependency.state === 'resolved' || dependency.state === 'failed') {
    await markCallbacksProcessed(context.pool, dependencyId);
    return (await resumeIfWaiting(context, dependency)) ? dependency.state : 'already_done';
  }
  if (dependency.state === 'pending' || !dependency.remote_task_id) dependency = (await adoptRemoteTask(context, remotes, dependency)) ?? dependency;
  // The run that started the remote task was cancelled: the remote task is cancelled in turn, as
  // soon as its id is known (decision 0066); until then the dependency waits like any other.
  if (dependency.remote_task_id && (await runStatus(context, dependency.run_id)) === 'cancelled') return cancelRemoteTask(context, remotes, dependency);
  if (dependency.state === 'pending' || !dependency.remote_task_id) {
    // A callback before the remote task id is known is kept; it is reconciled once the id is
    // stored or proven by GetTask. A message never acknowledged (the sender crashed mid-send, or
    // no callback named a task proven ours) fails after a while.
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

const runStatus = (context: Pick<KeelContext, 'pool'>, runId: string) =>
  context.pool.maybeOneFirst(sql.type(z.object({ status: z.string() }))`SELECT status FROM runs WHERE id = ${runId}`);

/**
 * CancelTask on the remote task of a cancelled run, as the agent's own client: the dependency ends
 * (failed, `parent_cancelled`) and the run's timeline records what the remote answered. A remote
 * that cannot be reached now is asked again at the next poll, with backoff.
 */
async function cancelRemoteTask(context: Pick<KeelContext, 'pool' | 'sealer' | 'logger'>, remotes: RemoteAgents, dependency: DependencyRow): Promise<ReconcileOutcome> {
  const remoteTaskId = dependency.remote_task_id!;
  const lookup = await remotes.get(dependency.remote_agent);
  if (!lookup.ok) {
    await schedulePoll(context.pool, dependency.id, pollDelayMs(dependency.polls));
    return 'unreachable';
  }
  let answer: 'canceled' | 'already_ended' | 'not_found';
  try {
    await lookup.remote.client.cancelTask(CancelTaskRequest.fromJSON({ id: remoteTaskId }));
    answer = 'canceled';
  } catch (error) {
    if (error instanceof TaskNotCancelableError) answer = 'already_ended';
    else if (error instanceof TaskNotFoundError) answer = 'not_found';
    else {
      context.logger.warn({ err: error, dependencyId: dependency.id }, 'CancelTask on the remote failed; trying again at the next poll');
      await schedulePoll(context.pool, dependency.id, pollDelayMs(dependency.polls));
      return 'unreachable';
    }
  }
  const ended = await resolveDependency(
    context.pool,
    context.sealer,
    dependency.id,
    'FAILED',
    'parent_cancelled',
    JSON.stringify({ state: 'canceled', message: 'the run that started this task was cancelled' }),
  );
  await markCallbacksProcessed(context.pool, dependency.id);
  if (!ended) return 'already_done';
  await recordEndedRunEvent(context.pool, dependency.run_id, 'remote_task_cancelled', {
    remoteAgent: dependency.remote_agent,
    remoteTaskId,
    dependencyId: dependency.id,
    answer,
  });
  return 'cancelled';
}

/** At most this many distinct candidate task ids are asked about per reconcile; the rest wait for the next. */
const CANDIDATES_PER_RECONCILE = 5;

/** The task id a callback body names: a candidate to ask the remote about, never adopted as such. */
export function namedTaskId(body: unknown): string | null {
  if (typeof body !== 'object' || body === null) return null;
  const { task, statusUpdate, artifactUpdate, message } = body as Record<string, { id?: unknown; taskId?: unknown } | undefined>;
  const taskId = task?.id ?? statusUpdate?.taskId ?? artifactUpdate?.taskId ?? message?.taskId;
  return typeof taskId === 'string' && taskId !== '' ? taskId : null;
}

type CandidateAnswer = { kind: 'ours'; task: SdkTask } | { kind: 'not_ours'; reason: 'task_not_found' | 'not_created_by_our_message' } | { kind: 'unreachable'; error: unknown };

/** GetTask on a candidate as the agent's own client, with the whole history (where our message is). */
async function askAboutCandidate(remote: RemoteAgent, taskId: string, messageId: string): Promise<CandidateAnswer> {
  try {
    const task = (await remote.client.getTask(GetTaskRequest.fromJSON({ id: taskId }))) as SdkTask;
    return createdByMessage(task, taskId, messageId) ? { kind: 'ours', task } : { kind: 'not_ours', reason: 'not_created_by_our_message' };
  } catch (error) {
    if (error instanceof TaskNotFoundError) return { kind: 'not_ours', reason: 'task_not_found' };
    return { kind: 'unreachable', error };
  }
}

/**
 * A sender that died after its message went out never stored the remote task id, and the run
 * retried after it waits on the same pending dependency. Callbacks to its registration may name a
 * task, but the body decides nothing (a valid callback credential says who may call, not which
 * task is ours): each id named is only a candidate, asked about with GetTask as the agent's own
 * client, and adopted (the guarded pending → waiting the sender would have written, with the ids
 * from GetTask's answer) only when that task's history holds the messageId recorded with the
 * dependency before the send. Callbacks whose candidate the remote does not know, or knows as a
 * task our message did not create, are marked processed and change nothing; while the remote
 * cannot be asked they stay. A dependency never proven this way fails by the give-up rule
 * (docs/client-role.md, docs/decisions/0015-adopt-a-remote-task-only-by-its-message-id.md).
 */
async function adoptRemoteTask(
  context: Pick<KeelContext, 'pool' | 'sealer' | 'logger'> & { config?: Pick<KeelContext['config'], 'inbox'> },
  remotes: RemoteAgents,
  dependency: DependencyRow,
): Promise<DependencyRow | null> {
  if (!dependency.message_id) return null;
  const rows = await unprocessedCallbacks(context.pool, dependency.id, context.config?.inbox.maxPendingPerRegistration ?? 100);
  if (rows.length === 0) return null;
  // A body naming no task has nothing to ask about: it stays, like any callback of a dependency
  // not yet known, until the dependency is resolved or gives up.
  const candidates = new Map<string, string[]>();
  for (const row of rows) {
    const opened = context.sealer.openJson<unknown>(callbackBodyContext(row.id), row.body);
    const taskId = opened.ok ? namedTaskId(opened.value) : null;
    if (taskId !== null) candidates.set(taskId, [...(candidates.get(taskId) ?? []), row.id]);
  }
  if (candidates.size === 0) return null;
  const refused: string[] = [];
  try {
    const lookup = await remotes.get(dependency.remote_agent);
    if (!lookup.ok) return null;
    for (const [taskId, callbackIds] of [...candidates].slice(0, CANDIDATES_PER_RECONCILE)) {
      const answer = await askAboutCandidate(lookup.remote, taskId, dependency.message_id);
      if (answer.kind === 'unreachable') {
        context.logger.warn({ err: answer.error, dependencyId: dependency.id }, 'GetTask on the remote failed; the task a callback named is asked about later');
        return null;
      }
      if (answer.kind === 'not_ours') {
        context.logger.warn(
          { dependencyId: dependency.id, callbackIds, reason: answer.reason },
          'a callback named a remote task this dependency’s message did not create; not adopted',
        );
        refused.push(...callbackIds);
        continue;
      }
      await acknowledgeDependency(context.pool, dependency.id, answer.task.id, answer.task.contextId || null);
      return getDependency(context.pool, dependency.id);
    }
    return null;
  } finally {
    await markCallbacksProcessedById(context.pool, refused);
  }
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
  // Under the hand-off's own job id: the job of the stretch that suspended may still hold the run's usual one.
  if (claimed) await enqueueHandOff(context.queues, claimed);
  return claimed !== null;
}
