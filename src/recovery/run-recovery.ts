import type { DatabasePool } from 'slonik';
import { sql } from 'slonik';
import { RUN_STATUSES, TERMINAL_RUN_STATUSES, TERMINATION_REASONS, type RunStatus } from '../../machines/run.machine.js';
import type { KeelLogger } from '../log/logger.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { retryJobId } from '../queue/job-ids.js';
import { dueOpenDependenciesOfRun } from '../remote/dependency-repository.js';
import type { Sealer } from '../sealing/sealer.js';
import { activePaths, RETRY_EVENT, stateText } from '../statecharts/definition-graph.js';
import { planRetry, type CommittedPoint, type RestoredState, type RetryPoint, type RetryRefusal } from '../statecharts/retry-point.js';
import type { StatechartDefinition } from '../statecharts/statechart-definition.js';
import { clearStatusMessage } from '../tasks/task-repository.js';
import { appendRunEvent } from '../runs/run-event-repository.js';
import { appendMachineStep, cancelRun, getRun, restorePointContext, restorePointsOf, retryFailedRun } from '../runs/run-repository.js';
import { runRow, type RunRow } from '../runs/run-row.js';

// Operator recovery (docs/operator.md, "Recovering runs"): a failed statechart run retried from a
// state it committed, as a new revision of the same run (same id, same A2A task, which is
// submitted again and works on to a new end), with an audit entry naming the operator's action and
// the state; and cancels and retries of many runs at once, chosen by agent, status, machine state
// or termination reason, each with a dry run that lists what would change and changes nothing.
// Where a retry starts and why one is refused is decided in src/statecharts/retry-point.ts.

export type RecoveryDeps = {
  pool: DatabasePool;
  sealer: Sealer;
  queues: KeelQueues;
  logger: KeelLogger;
  /** The agent's current machine (null: the agent is not a statechart agent of this configuration). */
  definitionOf: (agent: string) => Promise<StatechartDefinition | null>;
};

/** Who asked, for the audit entry and the log. */
export type Operator = { name: string; via: 'cli' | 'ui' };

export type RetryRefused =
  | { reason: 'not_found'; message: string }
  | { reason: 'not_failed'; message: string; status: RunStatus }
  | { reason: 'not_statechart' | 'rejected' | 'no_definition' | 'unreadable' | 'changed'; message: string }
  | RetryRefusal;

export type RetryCheck = { ok: true; run: RunRow; retry: RetryPoint; lastSequence: number; startedSteps: RestoredState['startedSteps'] } | ({ ok: false } & RetryRefused);
export type RetryResult = { ok: true; run: RunRow; state: string } | ({ ok: false } & RetryRefused);

/** Whether `run` may be retried from `stateName` (or its last committed state), and from which point: nothing is written. */
export async function checkRetry(deps: RecoveryDeps, run: RunRow, stateName?: string): Promise<RetryCheck> {
  if (run.status !== 'failed') {
    return { ok: false, reason: 'not_failed', status: run.status as RunStatus, message: `run ${run.id} is ${run.status}: only a failed run can be retried` };
  }
  if (run.machine_hash === null) {
    return { ok: false, reason: 'not_statechart', message: `run ${run.id} is not a statechart agent's run: only those are retried from a committed state` };
  }
  if ((run.failure_detail as { rejected?: unknown } | null)?.rejected === true) {
    return { ok: false, reason: 'rejected', message: `run ${run.id} was rejected by its agent: a rejection is an answer, not a failure to retry` };
  }
  const definition = await deps.definitionOf(run.agent);
  if (!definition) return { ok: false, reason: 'no_definition', message: `agent ${run.agent} has no statechart machine in this configuration: run ${run.id} cannot be retried` };
  const rows = await restorePointsOf(deps.pool, run.id);
  const points: CommittedPoint[] = rows.map((row) => {
    const opened = row.restore_point ? deps.sealer.openJson<RestoredState>(restorePointContext(run.id, row.sequence), row.restore_point) : null;
    return { sequence: row.sequence, value: row.state, event: row.event, hash: row.machine_hash, state: opened?.ok ? opened.value : null };
  });
  const plan = planRetry(points, definition, run.agent, stateName);
  if (!plan.ok) {
    const { ok: _ok, ...refusal } = plan;
    return { ok: false, ...refusal, message: `run ${run.id}: ${plan.message}` } as RetryCheck;
  }
  const startedSteps: RestoredState['startedSteps'] = {};
  for (const point of points) Object.assign(startedSteps, point.state?.startedSteps ?? {});
  return { ok: true, run, retry: plan.retry, lastSequence: rows.at(-1)?.sequence ?? 0, startedSteps };
}

/** The run's durable state restored at the retry's point: no decision or wait of its own, the run's totals so far, the step keys it used kept. */
function restoredState(check: Extract<RetryCheck, { ok: true }>): RestoredState {
  const { run, retry, lastSequence, startedSteps } = check;
  const record = retry.point.state.machine;
  const nextStep = Math.max(record.nextStep, ...Object.keys(startedSteps ?? {}).map((key) => Number.parseInt(key, 10) + 1));
  return {
    ...retry.point.state,
    machine: { ...record, transitions: lastSequence + 1, nextStep },
    startedSteps,
    waiting: null,
    resume: null,
    pendingApproval: null,
    pendingInput: null,
    pendingDependency: null,
    iteration: run.iterations,
    toolCallCount: run.tool_calls,
    inputTokens: run.input_tokens,
    outputTokens: run.output_tokens,
  };
}

/**
 * Retries a failed statechart run from `stateName` (or its last committed state): one transaction
 * queues the run again at a new revision (guarded by the revision it was checked at), adds the
 * retry to the run's path and the audit entry to its events, and clears the task's failure
 * message; the run's wake-up is enqueued after the commit.
 */
export async function retryRun(deps: RecoveryDeps, runId: string, operator: Operator, stateName?: string): Promise<RetryResult> {
  const run = await getRun(deps.pool, runId);
  if (!run) return { ok: false, reason: 'not_found', message: `run ${runId} not found` };
  const check = await checkRetry(deps, run, stateName);
  if (!check.ok) return check;
  const state = restoredState(check);
  const { point, name } = check.retry;
  const sequence = check.lastSequence + 1;
  const retried = await deps.pool.transaction(async (transaction) => {
    const row = await retryFailedRun(transaction, deps.sealer, run.id, run.revision, { state, machineState: point.value });
    if (!row) return null;
    await appendMachineStep(transaction, run.id, { sequence, state: point.value, event: RETRY_EVENT, machineHash: point.state.machine.hash }, { sealer: deps.sealer, state });
    if (run.audit_level !== 'none') {
      // Meta only (names, no content): the same at every audit level but none.
      await appendRunEvent(transaction, run.id, 'operator_retried', {
        operator: operator.name,
        via: operator.via,
        state: name,
        fromSequence: point.sequence,
        failedWith: run.termination_reason,
        revision: row.revision,
      });
    }
    if (row.task_id) await clearStatusMessage(transaction, row.task_id);
    return row;
  });
  if (!retried) return { ok: false, reason: 'changed', message: `run ${run.id} changed while it was being retried (retried or purged by someone else); look again` };
  await deps.queues.addJob('runs', retryJobId(retried.id, retried.revision), { runId: retried.id });
  deps.logger.info({ runId: run.id, operator: operator.name, via: operator.via, state: name, fromSequence: point.sequence, revision: retried.revision }, 'operator retried a failed run');
  return { ok: true, run: retried, state: name };
}

// ---------------------------------------------------------------------------------------------
// Many runs at once
// ---------------------------------------------------------------------------------------------

export type RunSelection = { agent?: string; status?: RunStatus; state?: string; reason?: string };

/** The most runs one bulk operation looks at. */
export const BULK_LIMIT = 1000;

/** Why a selection cannot be used, or null. */
export function selectionProblem(selection: RunSelection): string | null {
  if (!selection.agent && !selection.status && !selection.state && !selection.reason) return 'choose the runs: give at least one of agent, status, state or termination reason';
  if (selection.status && !RUN_STATUSES.includes(selection.status)) return `status must be one of ${RUN_STATUSES.join(', ')}`;
  if (selection.reason && !(TERMINATION_REASONS as readonly string[]).includes(selection.reason)) return `termination reason must be one of ${TERMINATION_REASONS.join(', ')}`;
  return null;
}

const matchesState = (value: unknown, state: string) => stateText(value) === state || activePaths(value).includes(state);

/**
 * The runs a selection names, oldest first (at most BULK_LIMIT); the state is the machine state a
 * statechart run stands in. With `only`, just those of these runs the selection still names (a
 * confirmation changes the runs its preview listed, never more).
 */
export async function selectRuns(pool: DatabasePool, selection: RunSelection, only?: ReadonlySet<string>): Promise<readonly RunRow[]> {
  const conditions = [sql.fragment`true`];
  if (only) conditions.push(sql.fragment`id = ANY(${sql.array([...only], 'uuid')})`);
  if (selection.agent) conditions.push(sql.fragment`agent = ${selection.agent}`);
  if (selection.status) conditions.push(sql.fragment`status = ${selection.status}`);
  if (selection.status && !(TERMINAL_RUN_STATUSES as readonly string[]).includes(selection.status)) conditions.push(sql.fragment`settled_at IS NULL`);
  if (selection.reason) conditions.push(sql.fragment`termination_reason = ${selection.reason}`);
  if (selection.state) conditions.push(sql.fragment`machine_state IS NOT NULL`);
  const rows = await pool.any(sql.type(runRow)`
    SELECT * FROM runs WHERE ${sql.join(conditions, sql.fragment` AND `)} ORDER BY created_at, id LIMIT ${BULK_LIMIT}`);
  return selection.state ? rows.filter((row) => matchesState(row.machine_state, selection.state!)) : rows;
}

export type BulkOutcome = 'would_cancel' | 'cancelled' | 'would_retry' | 'retried' | 'refused' | 'skipped';
export type BulkItem = { id: string; agent: string; status: string; state: string | null; reason: string | null; outcome: BulkOutcome; detail: string };
export type BulkReport = { action: 'cancel' | 'retry'; dryRun: boolean; selection: RunSelection; items: BulkItem[]; changed: number };

const itemOf = (run: RunRow, outcome: BulkOutcome, detail: string): BulkItem => ({
  id: run.id,
  agent: run.agent,
  status: run.status,
  state: run.machine_state === null || run.machine_state === undefined ? null : stateText(run.machine_state),
  reason: run.termination_reason,
  outcome,
  detail,
});

/** Cancels every run of the selection that has not ended (a dry run only lists them); ended runs are listed as skipped. */
export async function bulkCancel(
  deps: Pick<RecoveryDeps, 'pool' | 'logger'>,
  selection: RunSelection,
  options: { dryRun: boolean; operator: Operator; only?: ReadonlySet<string> },
): Promise<BulkReport> {
  const items: BulkItem[] = [];
  let changed = 0;
  for (const run of await selectRuns(deps.pool, selection, options.only)) {
    if ((TERMINAL_RUN_STATUSES as readonly string[]).includes(run.status)) {
      items.push(itemOf(run, 'skipped', `already ${run.status}`));
      continue;
    }
    if (options.dryRun) {
      items.push(itemOf(run, 'would_cancel', `${run.status} → cancelled`));
      continue;
    }
    const result = await cancelRun(deps.pool, deps.logger, run.id);
    if (result.settled) {
      // Remote tasks the run waits on are made due: a running Keel's poller cancels them.
      await dueOpenDependenciesOfRun(deps.pool, run.id);
      changed += 1;
      items.push(itemOf(run, 'cancelled', `${run.status} → cancelled`));
    } else {
      items.push(itemOf(run, 'skipped', result.current === null ? 'purged meanwhile' : `${result.current} meanwhile`));
    }
  }
  if (!options.dryRun) deps.logger.info({ operator: options.operator.name, via: options.operator.via, selection, cancelled: changed }, 'operator cancelled runs in bulk');
  for (const item of items) if (item.outcome === 'cancelled') deps.logger.info({ runId: item.id, operator: options.operator.name, via: options.operator.via }, 'operator cancelled a run');
  return { action: 'cancel', dryRun: options.dryRun, selection, items, changed };
}

/**
 * Retries every failed statechart run of the selection from its last committed state (or from
 * `fromState`); a dry run checks each as the retry would and lists where it would start or why it
 * is refused. Runs that are not failed are listed as skipped.
 */
export async function bulkRetry(
  deps: RecoveryDeps,
  selection: RunSelection,
  options: { dryRun: boolean; operator: Operator; fromState?: string; only?: ReadonlySet<string> },
): Promise<BulkReport> {
  const items: BulkItem[] = [];
  let changed = 0;
  for (const run of await selectRuns(deps.pool, selection, options.only)) {
    if (run.status !== 'failed') {
      items.push(itemOf(run, 'skipped', `${run.status}: only a failed run is retried`));
      continue;
    }
    if (options.dryRun) {
      const check = await checkRetry(deps, run, options.fromState);
      items.push(check.ok ? itemOf(run, 'would_retry', `from state ${check.retry.name}`) : itemOf(run, 'refused', check.message));
      continue;
    }
    const result = await retryRun(deps, run.id, options.operator, options.fromState);
    if (result.ok) {
      changed += 1;
      items.push(itemOf(run, 'retried', `from state ${result.state}`));
    } else {
      items.push(itemOf(run, 'refused', result.message));
    }
  }
  return { action: 'retry', dryRun: options.dryRun, selection, items, changed };
}
