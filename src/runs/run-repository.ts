import { recordRunEndedOutsideWorker } from '../tracing/ended-run-span.js';
import { randomUUID } from 'node:crypto';
import { sql, type CommonQueryMethods, type IdentifierSqlToken } from 'slonik';
import { z } from 'zod';
import {
  REASONS_BY_TERMINAL_STATUS,
  type CompletionReason,
  TERMINAL_RUN_STATUSES,
  TRUNCATING_REASONS,
  runMachine,
  type RunEventType,
  type RunStatus,
  type TerminalRunStatus,
  type TerminationReason,
} from '../../machines/run.machine.js';
import { allowedFrom, targetOf } from '../../machines/transitions.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { Ceilings } from '../privacy/resolve-ceilings.js';
import type { KeelLogger } from '../log/logger.js';
import type { Sealer } from '../sealing/sealer.js';
import { FIRST_CLAIM_REVISION, INSERTED_REVISION, runRow, type RunRow } from './run-row.js';
import { newRowId } from '../db/row-id.js';
import { rowShape, type ShapedRow } from '../db/row-shape.js';
import { appendRunEvent } from './run-event-repository.js';
import type { RunTrace } from '../tracing/run-trace.js';

// Every run transition is one guarded write: UPDATE ... WHERE status = ANY(<allowed-from>), with the
// allowed-from statuses read from machines/run.machine.ts, returning whether it happened. Each
// committed change increments `revision`.
//
// The only indexed columns these writes change are `settled_at` (the settle) and `available_at`
// (a requeue), so a claim, a lease renewal, an announced output, a suspension and a resume are HOT
// updates (sql/0016, docs/decisions/0024-fewer-row-versions.md). Queries for runs in an open
// status add OPEN_RUN, the predicate of the index of open runs (runs_open_idx on available_at,
// id), and filter the status among the open runs.

/** A run not settled yet: the predicate of runs_open_idx, which queries for open statuses repeat so the planner can use it. */
export const OPEN_RUN = sql.fragment`settled_at IS NULL`;

export type Db = CommonQueryMethods;

const statusArray = (statuses: readonly string[]) => sql.array(statuses, 'text');
const from = (event: RunEventType) => statusArray(allowedFrom(runMachine, event));
const to = (event: RunEventType) => targetOf(runMachine, event) as RunStatus;

export const queuedRequestContext = (runId: string) => ({ table: 'runs', column: 'queued_request', rowId: runId });
export const suspendedStateContext = (runId: string) => ({ table: 'runs', column: 'suspended_state', rowId: runId });

export type CreateRunInput = {
  id?: string;
  agent: string;
  auditLevel: PrivacyLevel;
  answerLevel: PrivacyLevel;
  /** The provider of the chain the ceilings were resolved with (the primary). */
  provider?: string;
  /** The A2A task this run serves, if any (its id is the task's first run id). */
  taskId?: string;
  request: unknown;
  /** Its place in its task's trace while tracing is on (src/tracing/run-trace.ts), else null. */
  trace?: RunTrace | null;
};

/** A run about to be inserted already claimed by the inserting process (the fast path): its claim (with its token) and the moment it starts. */
export type FastStart = { claim: HeldClaim; at: number };

/**
 * One run's row of an INSERT: QUEUED, or, with `fast`, already claimed by the inserting process
 * (the fast path, docs/decisions/0025-fast-path.md): the run machine's CLAIM applied at insert, so
 * the row is what a QUEUED insert followed by `claimQueuedRun` leaves (RUNNING, owner and lease
 * set, revision FIRST_CLAIM_REVISION). A fast run's creation and start share `at` (the caller's
 * clock, which also stamps the task's WORKING event), so `started_at = created_at` tells it from
 * a queued run; its lease runs on the database's clock, which the reaper reads. The lease is the
 * debt: a process that dies before settling it leaves a RUNNING run whose lease expires, and the
 * reaper requeues it like any claimed run.
 */
export function runValues(sealer: Sealer, input: CreateRunInput & { id: string }, fast: FastStart | null = null) {
  const request = sealer.sealJson(queuedRequestContext(input.id), input.request);
  return RUN_ROW.row({
    id: input.id,
    agent: input.agent,
    status: fast === null ? 'queued' : to('CLAIM'),
    audit_level: input.auditLevel,
    answer_level: input.answerLevel,
    provider: input.provider ?? null,
    task_id: input.taskId ?? null,
    request,
    claimed_by: fast?.claim.workerId ?? null,
    claim_token: fast?.claim.token ?? null,
    lease_ms: fast?.claim.leaseMs ?? null,
    at: fast?.at ?? null,
    revision: fast === null ? INSERTED_REVISION : FIRST_CLAIM_REVISION,
    trace_context: input.trace?.context ?? null,
    trace_parent_span: input.trace?.parentSpanId ?? null,
    trace_state: input.trace?.state ?? null,
  });
}

/** A run's row from `runValues`, as the INSERT's unnest names and types it (row-shape.ts). */
const RUN_ROW = rowShape([
  ['id', 'uuid'],
  ['agent', 'text'],
  ['status', 'text'],
  ['audit_level', 'text'],
  ['answer_level', 'text'],
  ['provider', 'text'],
  ['task_id', 'uuid'],
  ['request', 'bytea'],
  ['claimed_by', 'text'],
  ['claim_token', 'uuid'],
  ['lease_ms', 'float8'],
  ['at', 'float8'],
  ['revision', 'int8'],
  ['trace_context', 'text'],
  ['trace_parent_span', 'text'],
  ['trace_state', 'text'],
]);

/** How many cells a row from `runValues` has. */
export const RUN_COLUMNS = RUN_ROW.width;

/**
 * The INSERT of runs (rows from `runValues`), as a statement of its own or a CTE of a larger one:
 * the rows as arrays, so the text is the same for one run or sixty-four. A queued run is created
 * at the transaction's time, a fast one at its `at` (NULL for a queued run). With `onlyTasksOf`,
 * only the runs of the tasks that CTE's `task_id` names (the tasks an INSERT did insert).
 */
export function insertRunsStatement(rows: readonly ShapedRow[], onlyTasksOf: IdentifierSqlToken | null = null) {
  return sql.fragment`INSERT INTO runs (id, agent, status, audit_level, answer_level, provider, task_id, queued_request,
      claimed_by, claim_token, lease_expires_at, started_at, created_at, updated_at, status_changed_at, revision, trace_context, trace_parent_span, trace_state)
    SELECT v.id, v.agent, v.status, v.audit_level, v.answer_level, v.provider, v.task_id, v.request,
      v.claimed_by, v.claim_token, now() + v.lease_ms * interval '1 millisecond', to_timestamp(v.at / 1000.0),
      coalesce(to_timestamp(v.at / 1000.0), now()), coalesce(to_timestamp(v.at / 1000.0), now()), coalesce(to_timestamp(v.at / 1000.0), now()), v.revision,
      v.trace_context, v.trace_parent_span, v.trace_state
    FROM ${RUN_ROW.unnest(rows, 'v')}
    ${onlyTasksOf === null ? sql.fragment`` : sql.fragment`WHERE v.task_id IN (SELECT task_id FROM ${onlyTasksOf})`}`;
}

/** Inserts a QUEUED run, or with `fast` one already claimed by the inserting process (see `runValues`). */
export async function createRun(db: Db, sealer: Sealer, input: CreateRunInput, fast: FastStart | null = null): Promise<RunRow> {
  const id = input.id ?? newRowId();
  return db.one(sql.type(runRow)`${insertRunsStatement([runValues(sealer, { ...input, id }, fast)])} RETURNING *`);
}

export async function getRun(db: Db, runId: string): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`SELECT * FROM runs WHERE id = ${runId}`);
}

export type Claim = { workerId: string; leaseMs: number };

/**
 * A claim as its worker holds it: the worker, and the token the claim stamped into
 * `runs.claim_token` (sql/0031). Every write for a held run carries it and is refused unless the
 * row still holds it (`heldBy`): a run requeued, dead-lettered or claimed again since (by another
 * process or by this one) refuses the writes of the claim it no longer holds (docs/reliability.md,
 * "Fencing"; decision 0088).
 */
export type Holder = { workerId: string; token: string };

/** A claim with its token: what a worker renews a lease with. */
export type HeldClaim = Claim & Holder;

/** A new claim token: one per claim, never reused (a random UUID). */
export const newClaimToken = (): string => randomUUID();

/** The holder of a run row as it stands, for the writes of the claim it returned (null: the row holds no claim). */
export function holderOf(run: Pick<RunRow, 'claimed_by' | 'claim_token'>): Holder | null {
  return run.claimed_by === null || run.claim_token === null || run.claim_token === undefined ? null : { workerId: run.claimed_by, token: run.claim_token };
}

/** The guard of every write for a held run: the row still holds this claim (its worker and its token). */
export const heldBy = (holder: Holder) => sql.fragment`claimed_by = ${holder.workerId} AND claim_token = ${holder.token}`;

/**
 * A claim about to be made: its worker and lease, and the token to stamp when the caller chose it
 * (to find the claim again if its answer was lost with the connection); else a new one.
 */
export type NewClaim = Claim & { token?: string };

/** What a claim stamps besides its status: the owner, a new token, the lease. */
const claimedBy = (claim: NewClaim) =>
  sql.fragment`claimed_by = ${claim.workerId}, claim_token = ${claim.token ?? newClaimToken()}, lease_expires_at = now() + ${sql.interval({ seconds: claim.leaseMs / 1000 })}`;

/** Counters a worker reports with a suspension or a settle. */
export type RunTotals = { iterations: number; toolCalls: number; inputTokens: number; outputTokens: number };

const totalsFragment = (totals: RunTotals | undefined) =>
  totals === undefined
    ? sql.fragment``
    : sql.fragment`, iterations = ${totals.iterations}, tool_calls = ${totals.toolCalls},
        input_tokens = ${totals.inputTokens}, output_tokens = ${totals.outputTokens}`;

/** The claimant of a resume decided outside a worker (CLI, UI, API) until a worker takes it over. */
export const HANDOFF_PREFIX = 'handoff:';

/** QUEUED → RUNNING for one run whose delay has passed; stamps the owner and the lease. */
export async function claimQueuedRun(db: Db, runId: string, claim: NewClaim): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to('CLAIM')}, ${claimedBy(claim)},
      started_at = coalesce(started_at, now()), revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${from('CLAIM')}) AND available_at <= now()
    RETURNING *`);
}

/** Claims up to `limit` due runs in one statement; concurrent claimers skip each other's rows. */
export async function claimQueuedRuns(db: Db, limit: number, claim: NewClaim): Promise<readonly RunRow[]> {
  return db.any(sql.type(runRow)`
    UPDATE runs SET status = ${to('CLAIM')}, ${claimedBy(claim)},
      started_at = coalesce(started_at, now()), revision = revision + 1, updated_at = now()
    WHERE id IN (
      SELECT id FROM runs WHERE ${OPEN_RUN} AND status = ANY(${from('CLAIM')}) AND available_at <= now()
      ORDER BY available_at, id LIMIT ${limit} FOR UPDATE SKIP LOCKED)
    RETURNING *`);
}

/** Extends the lease only while this claim still holds the running run; false means it is lost. */
export async function renewLease(db: Db, runId: string, claim: HeldClaim): Promise<boolean> {
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE runs SET lease_expires_at = now() + ${sql.interval({ seconds: claim.leaseMs / 1000 })}
    WHERE id = ${runId} AND status = 'running' AND ${heldBy(claim)}
    RETURNING id`);
  return row !== null;
}

/**
 * The run's row with its lease renewed, while this worker still holds it running: a run this
 * process drives again after the database came back (its write was lost with the connection).
 * Null when the run is no longer its own (settled by a write that did commit, requeued, cancelled).
 */
export async function reclaimHeldRun(db: Db, runId: string, claim: HeldClaim): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET lease_expires_at = now() + ${sql.interval({ seconds: claim.leaseMs / 1000 })}
    WHERE id = ${runId} AND status = 'running' AND ${heldBy(claim)}
    RETURNING *`);
}

export type SuspendStatus = 'waiting_for_approval' | 'waiting_for_input' | 'waiting_for_dependency' | 'waiting_for_timer';
const SUSPEND_EVENT: Record<SuspendStatus, RunEventType> = {
  waiting_for_approval: 'SUSPEND_FOR_APPROVAL',
  waiting_for_input: 'SUSPEND_FOR_INPUT',
  waiting_for_dependency: 'SUSPEND_FOR_DEPENDENCY',
  waiting_for_timer: 'SUSPEND_FOR_TIMER',
};
const RESUME_EVENT: Record<SuspendStatus, RunEventType> = {
  waiting_for_approval: 'APPROVAL_DECIDED',
  waiting_for_input: 'INPUT_RECEIVED',
  waiting_for_dependency: 'DEPENDENCY_RESOLVED',
  waiting_for_timer: 'TIMER_DUE',
};

/** RUNNING → waiting, by the owner, storing the sealed suspended state with the transition. */
export async function suspendRun(
  db: Db,
  sealer: Sealer,
  runId: string,
  holder: Holder,
  status: SuspendStatus,
  state: unknown,
  totals?: RunTotals,
  /** A statechart run's timer (waiting_for_timer, or a wait bounded by a timer): a worker takes the run back once it is due. */
  dueAt?: number,
): Promise<RunRow | null> {
  const event = SUSPEND_EVENT[status];
  const sealed = sealer.sealJson(suspendedStateContext(runId), state);
  const due = sql.fragment`timer_due_at = ${dueAt === undefined ? null : sql.timestamp(new Date(dueAt))},`;
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to(event)}, suspended_state = ${sql.binary(sealed)}, ${due}
      claimed_by = NULL, lease_expires_at = NULL, inside_non_idempotent_call = NULL,
      revision = revision + 1, updated_at = now() ${totalsFragment(totals)}
    WHERE id = ${runId} AND status = ANY(${from(event)}) AND ${heldBy(holder)}
    RETURNING *`);
}

/**
 * waiting → RUNNING through one guarded claim, so two approvals (or a callback racing a poll) cannot
 * both resume the run. `expectedRevision` binds the claim to the suspension that was shown;
 * `resumeState` (sealed) replaces the suspended state in the same write, carrying the decision.
 */
export async function claimForResume(
  db: Db,
  runId: string,
  waitingStatus: SuspendStatus,
  claim: NewClaim,
  expectedRevision?: number,
  resume?: { sealer: Sealer; state: unknown },
): Promise<RunRow | null> {
  const event = RESUME_EVENT[waitingStatus];
  const state = resume ? sql.fragment`, suspended_state = ${sql.binary(resume.sealer.sealJson(suspendedStateContext(runId), resume.state))}` : sql.fragment``;
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to(event)}, ${claimedBy(claim)},
      revision = revision + 1, updated_at = now() ${state}
    WHERE id = ${runId} AND status = ${waitingStatus} AND status = ANY(${from(event)})
      ${expectedRevision === undefined ? sql.fragment`` : sql.fragment`AND revision = ${expectedRevision}`}
    RETURNING *`);
}

/**
 * A worker takes over a resume that a decider (CLI, UI, API) claimed as `handoff:<nonce>`. Only
 * that handoff is taken, by one worker.
 */
export async function takeOverHandoff(db: Db, runId: string, claim: NewClaim): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET ${claimedBy(claim)},
      revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = 'running' AND claimed_by LIKE ${`${HANDOFF_PREFIX}%`}
    RETURNING *`);
}

/** Marks (or clears) that the run is inside a non-idempotent tool call; only the owner may. */
export async function markNonIdempotentCall(db: Db, runId: string, holder: Holder, toolCallId: string | null): Promise<boolean> {
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE runs SET inside_non_idempotent_call = ${toolCallId}
    WHERE id = ${runId} AND status = 'running' AND ${heldBy(holder)}
    RETURNING id`);
  return row !== null;
}

/** The status in which a worker holds a run: the one its claim leads to. */
const held = () => statusArray([to('CLAIM')]);

/** The ceilings and revision of a run its worker holds, read under the row lock. */
export type HeldRunLevels = Ceilings & { revision: number };

/**
 * Locks the run for a step that writes beside it (outputs, a provider switch), but only while this
 * worker holds it; null means it does not any more (lease lost, cancelled) and the step writes nothing.
 */
export async function lockHeldRun(db: Db, runId: string, holder: Holder): Promise<HeldRunLevels | null> {
  const row = await db.maybeOne(sql.type(z.object({ audit_level: z.string(), answer_level: z.string(), revision: z.number() }))`
    SELECT audit_level, answer_level, revision FROM runs
    WHERE id = ${runId} AND status = ANY(${held()}) AND ${heldBy(holder)}
    FOR UPDATE`);
  return row && { auditLevel: row.audit_level as PrivacyLevel, answerLevel: row.answer_level as PrivacyLevel, revision: row.revision };
}

/**
 * Moves the held run to another provider of its chain with the ceilings resolved for it (tightened
 * by the caller, never loosened), as a revision of its own.
 */
export async function switchRunProvider(
  db: Db,
  runId: string,
  holder: Holder,
  provider: string,
  ceilings: Ceilings,
): Promise<boolean> {
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE runs SET audit_level = ${ceilings.auditLevel}, answer_level = ${ceilings.answerLevel}, provider = ${provider},
      revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${held()}) AND ${heldBy(holder)}
    RETURNING id`);
  return row !== null;
}

/**
 * A statechart agent's committed transition (docs/statechart-agents.md): the held run's durable
 * state (sealed, the machine's snapshot inside), the definition it runs and the state it reached,
 * by the owner only. No revision: a transition shows nothing by itself; what it shows (a status
 * message, an artifact) is announced with announceRunOutputs in the same transaction.
 */
export async function saveMachineProgress(
  db: Db,
  sealer: Sealer,
  runId: string,
  holder: Holder,
  progress: { state: unknown; machineHash: string; machineState: unknown; insideNonIdempotentStep: string | null },
): Promise<boolean> {
  const sealed = sealer.sealJson(suspendedStateContext(runId), progress.state);
  // The mark of a non-idempotent step stays until the transition that takes its outcome commits:
  // a crash before that dead-letters the run instead of running the step twice.
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE runs SET suspended_state = ${sql.binary(sealed)}, machine_hash = ${progress.machineHash},
      machine_state = ${sql.jsonb(progress.machineState as never)}, inside_non_idempotent_call = ${progress.insideNonIdempotentStep}, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${held()}) AND ${heldBy(holder)}
    RETURNING id`);
  return row !== null;
}

/** The sealing context of a transition's restore point (sql/0032): the run and the transition's sequence. */
export const restorePointContext = (runId: string, sequence: number) => ({ table: 'run_machine_steps', column: 'restore_point', rowId: `${runId}/${sequence}` });

/**
 * The path of a statechart run: one row per committed transition (sql/0017), with the run's durable
 * state right after it, sealed (its restore point, sql/0032): an operator's retry starts from one.
 */
export async function appendMachineStep(
  db: Db,
  runId: string,
  step: { sequence: number; state: unknown; event: string; machineHash: string },
  restorePoint: { sealer: Sealer; state: unknown } | null = null,
): Promise<void> {
  const sealed = restorePoint ? sql.binary(restorePoint.sealer.sealJson(restorePointContext(runId, step.sequence), restorePoint.state)) : null;
  await db.query(sql.unsafe`
    INSERT INTO run_machine_steps (run_id, sequence, state, event, machine_hash, restore_point)
    VALUES (${runId}, ${step.sequence}, ${sql.jsonb(step.state as never)}, ${step.event}, ${step.machineHash}, ${sealed})
    ON CONFLICT (run_id, sequence) DO UPDATE SET state = EXCLUDED.state, event = EXCLUDED.event, machine_hash = EXCLUDED.machine_hash,
      restore_point = EXCLUDED.restore_point, at = now()`);
}

const restorePointRow = z.object({ sequence: z.number(), state: z.unknown(), event: z.string(), machine_hash: z.string(), restore_point: z.instanceof(Buffer).nullable() });
export type RestorePointRow = z.infer<typeof restorePointRow>;

/** A statechart run's committed transitions with their sealed restore points, in order. */
export async function restorePointsOf(db: Db, runId: string): Promise<readonly RestorePointRow[]> {
  return db.any(sql.type(restorePointRow)`
    SELECT sequence, state, event, machine_hash, restore_point FROM run_machine_steps WHERE run_id = ${runId} ORDER BY sequence`);
}

/**
 * FAILED → QUEUED by an operator's retry (the run machine's RETRY): same run, same task, a new
 * revision, restored to `state` (sealed into suspended_state, as a suspension stores it). Guarded
 * by the status and the revision the retry was planned at, so a second retry (or any other write
 * since) finds nothing. Everything a settle wrote is cleared; the run is due at once.
 */
export async function retryFailedRun(
  db: Db,
  sealer: Sealer,
  runId: string,
  expectedRevision: number,
  restored: { state: unknown; machineState: unknown },
): Promise<RunRow | null> {
  const sealed = sealer.sealJson(suspendedStateContext(runId), restored.state);
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to('RETRY')}, termination_reason = NULL, truncated = false, error_class = NULL, failure_detail = NULL,
      settled_at = NULL, claimed_by = NULL, lease_expires_at = NULL, inside_non_idempotent_call = NULL, timer_due_at = NULL,
      suspended_state = ${sql.binary(sealed)}, machine_state = ${sql.jsonb(restored.machineState as never)},
      available_at = now(), revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${from('RETRY')}) AND revision = ${expectedRevision}
    RETURNING *`);
}

/**
 * Runs waiting with a durable timer, with what is left of the wait: each owes a delayed `runs` job
 * (timerJobId), which the sweep restores when it is gone.
 */
export async function listTimerWaits(db: Db, limit: number): Promise<readonly { id: string; revision: number; delay_ms: number }[]> {
  return db.any(sql.type(z.object({ id: z.string(), revision: z.number(), delay_ms: z.number() }))`
    SELECT id, revision, greatest(0, extract(epoch FROM (timer_due_at - now())) * 1000)::float8 AS delay_ms
    FROM runs WHERE ${OPEN_RUN} AND timer_due_at IS NOT NULL AND status = ANY(${from('TIMER_DUE')})
    ORDER BY timer_due_at, id LIMIT ${limit}`);
}

/**
 * A waiting run whose timer is due → RUNNING by a worker (a job that fired early, or after the
 * wait was answered, finds nothing).
 */
export async function claimDueTimer(db: Db, runId: string, claim: NewClaim): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to('TIMER_DUE')}, ${claimedBy(claim)},
      timer_due_at = NULL, revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${from('TIMER_DUE')}) AND timer_due_at <= now()
    RETURNING *`);
}

/**
 * Announces the outputs the held run stores in the same transaction, at the revision this write
 * reaches: the projector turns each revision into journal events.
 */
export async function announceRunOutputs(db: Db, runId: string, holder: Holder): Promise<boolean> {
  const row = await db.maybeOneFirst(sql.type(z.object({ id: z.string() }))`
    UPDATE runs SET revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${held()}) AND ${heldBy(holder)}
    RETURNING id`);
  return row !== null;
}

export type SettleInput = {
  status: TerminalRunStatus;
  reason: TerminationReason;
  errorClass?: string | null;
  /** Why, without content: a guardrail's name and configured reason, a provider's error class. */
  failureDetail?: Record<string, unknown> | null;
  totals?: RunTotals;
  /** When given, only this claim may settle (a worker that lost its lease cannot, nor one whose run was claimed again). */
  holder?: Holder;
};

export type SettleResult = { settled: true; run: RunRow } | { settled: false; current: RunStatus | null };

/**
 * What every settle writes besides its status and reason: no owner or lease any more, and neither
 * the request nor the suspended turn (a settled run needs neither: keep nothing), a new revision.
 */
const SETTLED = sql.fragment`claimed_by = NULL, lease_expires_at = NULL, inside_non_idempotent_call = NULL,
  queued_request = NULL, suspended_state = NULL, settled_at = now(), revision = revision + 1, updated_at = now()`;

export type CompletedSettle = {
  runId: string;
  holder: Holder;
  reason: CompletionReason;
  totals: RunTotals;
  /** The status time the writer chose (decision 0029, sql/0018); without it, the transaction's. */
  at?: number;
};

/** A completion's row for completeRunsStatement. */
export function settleRow({ runId, holder, reason, totals, at }: CompletedSettle) {
  return SETTLE_ROW.row({
    id: runId,
    worker: holder.workerId,
    token: holder.token,
    reason,
    truncated: TRUNCATING_REASONS.includes(reason),
    iterations: totals.iterations,
    tool_calls: totals.toolCalls,
    input_tokens: totals.inputTokens,
    output_tokens: totals.outputTokens,
    at: at ?? null,
  });
}

/** A completion's settle row, as completeRunsStatement's unnest names and types it (row-shape.ts). */
const SETTLE_ROW = rowShape([
  ['id', 'uuid'],
  ['worker', 'text'],
  ['token', 'uuid'],
  ['reason', 'text'],
  ['truncated', 'bool'],
  ['iterations', 'int4'],
  ['tool_calls', 'int4'],
  ['input_tokens', 'int8'],
  ['output_tokens', 'int8'],
  ['at', 'float8'],
]);

/** How many cells a settleRow has. */
export const SETTLE_COLUMNS = SETTLE_ROW.width;

/**
 * The completions of several held runs as one UPDATE (a CTE of the caller's statement, group
 * commit): what settleRun writes for each, guarded the same way (only from the statuses COMPLETE
 * leaves, only by the worker holding the run). The target is `r`: the caller returns what it reads of it. With
 * `onlyRunsOf`, only the runs that CTE of the same statement names (`run_id`): the ones it locked
 * and found as the caller expected (complete-held-runs.ts).
 */
export function completeRunsStatement(rows: readonly ShapedRow[], onlyRunsOf: IdentifierSqlToken | null = null) {
  return sql.fragment`
    UPDATE runs r SET status = ${to('COMPLETE')}, termination_reason = v.reason, truncated = v.truncated, error_class = NULL, failure_detail = NULL,
      ${SETTLED}, status_changed_at = coalesce(to_timestamp(v.at / 1000.0), r.status_changed_at),
      iterations = v.iterations, tool_calls = v.tool_calls, input_tokens = v.input_tokens, output_tokens = v.output_tokens
    FROM ${SETTLE_ROW.unnest(rows, 'v')}
    WHERE r.id = v.id AND r.status = ANY(${from('COMPLETE')}) AND r.claimed_by = v.worker AND r.claim_token = v.token
      ${onlyRunsOf === null ? sql.fragment`` : sql.fragment`AND r.id IN (SELECT run_id FROM ${onlyRunsOf})`}`;
}

const SETTLE_EVENT: Record<TerminalRunStatus, RunEventType> = { completed: 'COMPLETE', failed: 'FAIL', cancelled: 'CANCEL' };

/**
 * The one way a run becomes terminal. Only a non-terminal row changes; a late or duplicate settle
 * returns `settled: false` and is logged at notice level, so terminal stays terminal.
 */
export async function settleRun(db: Db, logger: KeelLogger, runId: string, input: SettleInput): Promise<SettleResult> {
  const allowedReasons: readonly TerminationReason[] = REASONS_BY_TERMINAL_STATUS[input.status];
  if (!allowedReasons.includes(input.reason)) {
    throw new Error(`termination reason ${input.reason} does not belong to status ${input.status}`);
  }
  const event = SETTLE_EVENT[input.status];
  const truncated = TRUNCATING_REASONS.includes(input.reason);
  const run = await db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${input.status}, termination_reason = ${input.reason}, truncated = ${truncated},
      error_class = ${input.errorClass ?? null},
      failure_detail = ${input.failureDetail ? sql.jsonb(input.failureDetail as never) : null},
      ${SETTLED} ${totalsFragment(input.totals)}
    WHERE id = ${runId} AND status = ANY(${from(event)})
      ${input.holder === undefined ? sql.fragment`` : sql.fragment`AND ${heldBy(input.holder)}`}
    RETURNING *`);
  if (run) return { settled: true, run };
  const current = await db.maybeOneFirst(sql.type(z.object({ status: z.string() }))`SELECT status FROM runs WHERE id = ${runId}`);
  logger.notice({ runId, attempted: input.status, reason: input.reason, current }, 'late settle refused: the run was not settled again');
  return { settled: false, current: (current as RunStatus | null) ?? null };
}

/**
 * The NOTIFY a cancel sends with its commit, the run's id as payload: the process driving the run
 * hears it on its LISTEN connection and stops the run's work at once, instead of at its next lease
 * renewal (docs/decisions/0066-cancellation-reaches-the-work.md).
 */
export const RUN_CANCEL_CHANNEL = 'keel_run_cancel';

/**
 * Any non-terminal run → CANCELLED (A2A CancelTask and `keel runs cancel`), in one transaction with
 * the NOTIFY that reaches the process driving it. A run no worker holds (queued, or in a wait:
 * input, approval, timer, dependency) ends here, and its timeline records the cancel and the wait
 * it ended; a running run's own worker records where the cancel found it.
 */
export async function cancelRun(db: Db, logger: KeelLogger, runId: string): Promise<CancelResult> {
  const result = await db.transaction(async (transaction): Promise<CancelResult> => {
    const prior = await transaction.maybeOne(sql.type(z.object({ status: z.string(), audit_level: z.string() }))`
      SELECT status, audit_level FROM runs WHERE id = ${runId} FOR UPDATE`);
    const settled = await settleRun(transaction, logger, runId, { status: 'cancelled', reason: 'cancelled' });
    if (!settled.settled || !prior) return settled;
    const cancelled = { ...settled, from: prior.status as RunStatus };
    await transaction.query(sql.unsafe`SELECT pg_notify(${RUN_CANCEL_CHANNEL}, ${runId})`);
    if (prior.status !== 'running' && prior.audit_level !== 'none') {
      // Meta only (no content): the same at every audit level but none.
      await appendRunEvent(transaction, runId, 'cancelled', { from: prior.status });
    }
    return cancelled;
  });
  // A running run's own worker records its span when the cancel reaches it; any other ends here.
  if (result.settled && 'from' in result && result.from !== 'running') recordRunEndedOutsideWorker(result.run, 'cancelled');
  return result;
}

/** A cancel's outcome; when it settled, the status it ended (`running`: a worker held the run). */
export type CancelResult = SettleResult | (Extract<SettleResult, { settled: true }> & { from: RunStatus });

/**
 * The reaper's guard: the run's row is not locked by another session. A row lock means a write of
 * the run is under way, or that its writer's link went silent inside a transaction (the server
 * holds the lock until it ends that session: database.linkTimeoutSeconds, decision 0092). The
 * reaper skips such a run until its next sweep instead of waiting on it: waiting, one run locked by
 * a cut-off worker held up every later run of the sweep, and every later sweep, for a minute.
 */
const unlocked = (runId: string) => sql.fragment`id IN (SELECT id FROM runs WHERE id = ${runId} FOR UPDATE SKIP LOCKED)`;

/** RUNNING with an expired lease → QUEUED after `delayMs` (the reaper). */
export async function requeueRun(db: Db, runId: string, delayMs: number): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to('REQUEUE')}, claimed_by = NULL, claim_token = NULL, lease_expires_at = NULL,
      requeue_count = requeue_count + 1, available_at = now() + ${sql.interval({ seconds: delayMs / 1000 })},
      revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${from('REQUEUE')}) AND lease_expires_at < now() AND ${unlocked(runId)}
    RETURNING *`);
}

/**
 * A worker shutting down gives a run back: RUNNING → QUEUED at once, by its owner, without
 * counting a requeue (nothing went wrong). A run inside a non-idempotent call is not released.
 */
export async function releaseRun(db: Db, runId: string, holder: Holder): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to('REQUEUE')}, claimed_by = NULL, claim_token = NULL, lease_expires_at = NULL, available_at = now(),
      revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${from('REQUEUE')}) AND ${heldBy(holder)} AND inside_non_idempotent_call IS NULL
    RETURNING *`);
}

/** RUNNING with an expired lease → FAILED (`retries_exhausted`), never retried again. */
export async function deadLetterRun(db: Db, runId: string): Promise<RunRow | null> {
  const run = await db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to('DEAD_LETTER')}, termination_reason = 'retries_exhausted',
      failure_detail = jsonb_build_object('requeues', requeue_count, 'insideNonIdempotentCall', inside_non_idempotent_call IS NOT NULL),
      claimed_by = NULL, claim_token = NULL, lease_expires_at = NULL, queued_request = NULL, suspended_state = NULL,
      settled_at = now(), revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${from('DEAD_LETTER')}) AND lease_expires_at < now() AND ${unlocked(runId)}
    RETURNING *`);
  if (run) recordRunEndedOutsideWorker(run, 'dead_lettered');
  return run;
}

/** Runs waiting for an approval for longer than `timeoutHours`, oldest first. */
export async function listApprovalsPastTimeout(db: Db, timeoutHours: number, limit: number): Promise<readonly string[]> {
  return db.anyFirst(sql.type(z.object({ id: z.string() }))`
    SELECT id FROM runs
    WHERE ${OPEN_RUN} AND status = ANY(${from('APPROVAL_TIMED_OUT')})
      AND status_changed_at <= now() - ${sql.interval({ seconds: timeoutHours * 3600 })}
    ORDER BY status_changed_at, id LIMIT ${limit}`);
}

/**
 * waiting_for_approval → FAILED (`approval_denied`) once the run has waited `timeoutHours`. The
 * guard rereads both the status and the waiting time, so an approval or a cancel that committed
 * first keeps the run: exactly one of them has it.
 */
export async function timeOutApproval(db: Db, runId: string, timeoutHours: number): Promise<RunRow | null> {
  return db.maybeOne(sql.type(runRow)`
    UPDATE runs SET status = ${to('APPROVAL_TIMED_OUT')}, termination_reason = 'approval_denied',
      failure_detail = ${sql.jsonb({ reason: 'approval_timed_out', timeoutHours })},
      claimed_by = NULL, lease_expires_at = NULL, inside_non_idempotent_call = NULL,
      queued_request = NULL, suspended_state = NULL,
      settled_at = now(), revision = revision + 1, updated_at = now()
    WHERE id = ${runId} AND status = ANY(${from('APPROVAL_TIMED_OUT')})
      AND status_changed_at <= now() - ${sql.interval({ seconds: timeoutHours * 3600 })}
    RETURNING *`);
}

/** Runs that owe a `runs` job: queued and due (the sweeper re-enqueues those whose job is missing). */
export async function listQueuedRunIds(db: Db, limit: number): Promise<readonly string[]> {
  return db.anyFirst(sql.type(z.object({ id: z.string() }))`
    SELECT id FROM runs WHERE ${OPEN_RUN} AND status = 'queued' ORDER BY available_at, id LIMIT ${limit}`);
}

export type ListRunsFilter = { status?: RunStatus; agent?: string; limit: number; before?: { createdAt: number; id: string } };

export async function listRuns(db: Db, filter: ListRunsFilter): Promise<readonly RunRow[]> {
  const conditions = [sql.fragment`true`];
  if (filter.status) conditions.push(sql.fragment`status = ${filter.status}`);
  if (filter.status && !(TERMINAL_RUN_STATUSES as readonly RunStatus[]).includes(filter.status)) conditions.push(OPEN_RUN);
  if (filter.agent) conditions.push(sql.fragment`agent = ${filter.agent}`);
  if (filter.before) {
    conditions.push(sql.fragment`(created_at, id) < (${sql.timestamp(new Date(filter.before.createdAt))}, ${filter.before.id})`);
  }
  return db.any(sql.type(runRow)`
    SELECT * FROM runs WHERE ${sql.join(conditions, sql.fragment` AND `)}
    ORDER BY created_at DESC, id DESC LIMIT ${filter.limit}`);
}

const runTraceRow = z.object({ trace_context: z.string().nullable(), trace_parent_span: z.string().nullable(), trace_state: z.string().nullable() });

/**
 * A run's stored trace columns (src/tracing/run-trace.ts), or null for no such run: for the spans of
 * work done for it outside a worker's stretch (a reconcile's remote calls; a push delivery, by its
 * task's id, which is its run's).
 */
export async function getRunTrace(db: Db, runId: string): Promise<z.infer<typeof runTraceRow> | null> {
  return db.maybeOne(sql.type(runTraceRow)`SELECT trace_context, trace_parent_span, trace_state FROM runs WHERE id = ${runId}`);
}
