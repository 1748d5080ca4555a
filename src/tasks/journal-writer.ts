import { sql, type CommonQueryMethods, type IdentifierSqlToken } from 'slonik';
import { rowShape, type ShapedRow } from '../db/row-shape.js';
import { z } from 'zod';
import type { RunStatus, TerminationReason } from '../../machines/run.machine.js';
import type { StoredRunOutput } from '../runs/run-output-repository.js';
import type { Sealer } from '../sealing/sealer.js';
import { recordDeliveriesFor } from '../push/delivery-repository.js';
import { endsStream, isTerminalState, isoTime, type Artifact, type Message, type StreamResponse, type TaskState } from '../protocol/wire.js';
import { eventContext, JOURNAL_CHANNEL, journalNotice, type JournalNotice } from './journal.js';
import { failureMetadata, failureStatusMessage } from './failure-status.js';
import { taskStateOf } from './task-state.js';

// The journal events of committed run revisions, built and written in one place for the two
// writers (docs/decisions/0022-completion-writes-the-journal.md): the completion transaction, which
// journals the run's end itself, and the projector, which journals every other transition and
// repairs what a crash left undone. Both hold the task-row lock and write everything from the
// task's watermark (`a2a_tasks.projected_revision`) up to the run's revision at once, so a revision
// is journaled once, whichever of the two gets there first.

/** What the journal's writers need to write the push outbox with the journal. */
export type ProjectionOptions = { push: { deadlineHours: number; maxPendingPerConfig: number; maxPendingTotal: number } };

export const DEFAULT_PROJECTION_OPTIONS: ProjectionOptions = { push: { deadlineHours: 24, maxPendingPerConfig: 1000, maxPendingTotal: 100_000 } };

/**
 * The task as its journal last left it, read under the task-row lock. Its content is what the task
 * row stores (sealed at the task's answer level); it is opened only when an event carries it.
 */
export type JournalHead = {
  taskId: string;
  contextId: string;
  /** The watermark: the run revision the journal has reached. */
  projectedRevision: number;
  lastSequence: number;
  projectedState: TaskState;
  directMessage: boolean;
  statusMessage: () => Message | null;
  artifacts: () => Artifact[];
};

/** The run as committed (or as the transaction holding its lock has just written it). */
export type CommittedRun = {
  runId: string;
  status: RunStatus;
  revision: number;
  startedAt: number | null;
  statusChangedAt: number;
  terminationReason: TerminationReason | null;
  failureDetail: Record<string, unknown> | null;
};

export type JournalEventDraft = { kind: 'status' | 'artifact' | 'message'; state: TaskState | null; response: StreamResponse };

/**
 * The events that take the journal from `head` to the run's committed state, in order: WORKING
 * when the journal still shows the task waiting, the artifacts the run committed since the
 * watermark, then the new state (with the result's artifacts and status message, or the derived
 * status message of a run that ended without one). Empty when the revision is journaled already.
 */
export function journalEventsSince(head: JournalHead, run: CommittedRun, outputs: readonly StoredRunOutput[]): JournalEventDraft[] {
  if (run.revision <= head.projectedRevision) return [];
  // The events' objects are written out field by field, never as `{ ...base, more }`: Node 20's V8
  // gives every object built by a spread followed by more fields a hidden class of its own, in old
  // space (docs/decisions/0050-no-leading-spread-on-the-hot-path.md).
  const { taskId, contextId } = head;
  const events: JournalEventDraft[] = [];
  const status = (state: TaskState, timestamp: number, message?: Message): JournalEventDraft => ({
    kind: 'status',
    state,
    response: { statusUpdate: { taskId, contextId, status: { state, ...(message ? { message } : {}), timestamp: isoTime(timestamp) } } },
  });
  let projected = head.projectedState;
  const state = taskStateOf(run.status, run.failureDetail);

  if (projected === 'TASK_STATE_SUBMITTED' && run.startedAt !== null && state !== 'TASK_STATE_SUBMITTED' && state !== 'TASK_STATE_REJECTED') {
    // The first start is when the run started; a start after a requeue (the journal went back to
    // SUBMITTED) is when it was claimed again: two WORKING events, two moments, never one body twice.
    events.push(status('TASK_STATE_WORKING', head.lastSequence === 0 ? run.startedAt : run.statusChangedAt));
    projected = 'TASK_STATE_WORKING';
  }
  // A waiting run changes revision only by leaving the wait, so a run seen INPUT_REQUIRED again at
  // a newer revision took its input and asked for more before this projection: the journal still
  // shows it working in between (and a blocking follow-up sees the new INPUT_REQUIRED).
  const askedAgain = projected === 'TASK_STATE_INPUT_REQUIRED' && state === 'TASK_STATE_INPUT_REQUIRED';
  if (projected === 'TASK_STATE_INPUT_REQUIRED' && ((state !== 'TASK_STATE_INPUT_REQUIRED' && run.status !== 'queued') || askedAgain)) {
    events.push(status('TASK_STATE_WORKING', run.statusChangedAt));
    projected = 'TASK_STATE_WORKING';
  }

  // Artifacts the agent emitted during the run, and the status messages a statechart agent showed
  // on entering a state (docs/statechart-agents.md), in the order they were committed.
  const emitted = outputs.filter(
    (output) =>
      (output.kind === 'artifact' || output.kind === 'status') && output.level !== 'metadata' && output.runRevision > head.projectedRevision && output.runRevision <= run.revision,
  );
  for (const output of emitted) {
    if (output.kind === 'status') {
      const parts = ((output.content as { parts?: Message['parts'] }).parts ?? []) as Message['parts'];
      const message: Message = { messageId: `${head.taskId}-status-o${output.ordinal}`, role: 'ROLE_AGENT', parts, contextId: head.contextId, taskId: head.taskId };
      events.push(status('TASK_STATE_WORKING', run.statusChangedAt, message));
      projected = 'TASK_STATE_WORKING';
      continue;
    }
    const content = output.content as { name?: string; description?: string; parts?: Artifact['parts'] };
    events.push({
      kind: 'artifact',
      state: null,
      response: {
        artifactUpdate: {
          taskId,
          contextId,
          artifact: { artifactId: output.artifactId ?? `artifact-${output.ordinal}`, ...(content.name ? { name: content.name } : {}), parts: content.parts ?? [] },
          append: output.append,
          lastChunk: output.lastChunk,
        },
      },
    });
  }

  if (state !== projected) {
    const statusMessage = head.statusMessage();
    if (state === 'TASK_STATE_COMPLETED' && head.directMessage && statusMessage) {
      const { taskId: _taskId, ...message } = statusMessage;
      events.push({ kind: 'message', state: 'TASK_STATE_COMPLETED', response: { message } });
    } else if (state === 'TASK_STATE_COMPLETED') {
      // The result written by the completion transaction: artifacts not already streamed.
      const streamed = new Set(outputs.filter((output) => output.kind === 'artifact').map((output) => output.artifactId));
      for (const artifact of head.artifacts().filter((candidate) => !streamed.has(candidate.artifactId))) {
        events.push({ kind: 'artifact', state: null, response: { artifactUpdate: { taskId, contextId, artifact, lastChunk: true } } });
      }
      events.push(status(state, run.statusChangedAt, statusMessage ?? undefined));
    } else {
      const reason = run.terminationReason;
      const derived: Message | undefined =
        statusMessage ??
        (reason ? failureStatusMessage({ id: head.taskId, contextId: head.contextId }, `${head.taskId}-status-${run.revision}`, reason, run.failureDetail) : undefined);
      events.push(status(state, run.statusChangedAt, state === 'TASK_STATE_WORKING' || state === 'TASK_STATE_SUBMITTED' ? undefined : derived));
      const metadata = failureMetadata(reason);
      if (metadata) {
        const last = events[events.length - 1]!.response as Extract<StreamResponse, { statusUpdate: unknown }>;
        last.statusUpdate.metadata = metadata;
      }
    }
  }
  return events;
}

const journalWrite = z.object({
  updated: z.number(),
  inserted: z.number(),
  notified: z.boolean(),
  push_configs: z.array(z.string()),
  task_state: z.string().nullable(),
  status_timestamp: z.number().nullable(),
});

export type JournalWrite = {
  /** Events written (0: the revision was journaled already, nothing was written). */
  events: number;
  revision: number;
  /** The push deliveries written with the events (their wake-ups are added after the commit). */
  deliveryIds: string[];
  /** What the commit NOTIFYs, null when it NOTIFYs nothing. */
  notice: JournalNotice | null;
  /** The task row after the write: its state and status timestamp. */
  state: TaskState;
  statusTimestamp: number;
  lastSequence: number;
};

/**
 * Writes `events` after the head's last sequence at the run's revision, in the caller's
 * transaction, which holds the task-row lock: one statement writes the journal rows and the
 * watermark, queues the NOTIFY (delivered at commit) and reads the task's push configs (after the
 * task-row lock); the push outbox follows only when there are configs. A delivery's id is derived
 * from its task, config and event (src/push/delivery-id.ts), so an event journaled twice names
 * one delivery. The transaction commits synchronously
 * (docs/decisions/0019-nothing-visible-committed-asynchronously.md): its NOTIFY shows the events.
 */
export async function writeJournalEvents(
  transaction: CommonQueryMethods,
  sealer: Sealer,
  head: JournalHead,
  run: CommittedRun,
  events: readonly JournalEventDraft[],
  options: ProjectionOptions,
): Promise<JournalWrite> {
  const state = taskStateOf(run.status, run.failureDetail);
  const { rows, lastSequence, notice, ends } = journalRows(sealer, head, run, events);
  const written = await transaction.one(sql.type(journalWrite)`
    WITH ${
      rows.length > 0
        ? sql.fragment`journal AS (${insertJournalRowsStatement(rows)} RETURNING 1),`
        : sql.fragment``
    } watermark AS (
      UPDATE a2a_tasks SET projected_revision = ${run.revision}, last_sequence = ${lastSequence}, projected_state = ${state}
      WHERE id = ${head.taskId} RETURNING state, status_timestamp)
    SELECT
      (SELECT count(*) FROM watermark)::int AS updated,
      ${rows.length > 0 ? sql.fragment`(SELECT count(*) FROM journal)::int` : sql.fragment`0`} AS inserted,
      ${notice !== null ? sql.fragment`pg_notify(${JOURNAL_CHANNEL}, ${notice}) IS NOT NULL` : sql.fragment`false`} AS notified,
      ${
        rows.length > 0
          ? sql.fragment`ARRAY(SELECT id FROM push_configs WHERE task_id = ${head.taskId} AND deleted_at IS NULL AND state IN ('active', 'paused') ORDER BY id)`
          : sql.fragment`ARRAY[]::text[]`
      } AS push_configs,
      (SELECT state FROM watermark) AS task_state,
      (SELECT status_timestamp FROM watermark) AS status_timestamp`);
  if (written.updated !== 1 || written.inserted !== rows.length || written.task_state === null || written.status_timestamp === null) {
    throw new Error(`journal of run ${run.runId}: wrote ${written.inserted} of ${rows.length} events and ${written.updated} watermarks`);
  }
  const deliveryIds = await recordEventDeliveries(transaction, head, events, written.push_configs, options);
  return {
    events: events.length,
    revision: run.revision,
    deliveryIds,
    notice: notice === null ? null : { taskId: head.taskId, lastSequence, ends },
    state: written.task_state as TaskState,
    statusTimestamp: written.status_timestamp,
    lastSequence,
  };
}

/** A journal row as written: task, sequence, run, revision, ordinal, kind, state, sealed payload (row-shape.ts). */
export const JOURNAL_ROW = rowShape([
  ['task_id', 'uuid'],
  ['sequence', 'int4'],
  ['run_id', 'uuid'],
  ['run_revision', 'int8'],
  ['ordinal', 'int4'],
  ['kind', 'text'],
  ['state', 'text'],
  ['payload', 'bytea'],
]);
export type JournalRow = ShapedRow;

/** How many cells a JournalRow has. */
export const JOURNAL_COLUMNS = JOURNAL_ROW.width;

/** The INSERT of journal rows (journalRows), for a CTE of the caller's statement: the one way events are stored. With `onlyTasksOf`, only the rows of the tasks that CTE names. */
export function insertJournalRowsStatement(rows: readonly JournalRow[], onlyTasksOf: IdentifierSqlToken | null = null) {
  return sql.fragment`INSERT INTO a2a_events (task_id, sequence, run_id, run_revision, ordinal, kind, state, payload)
      SELECT j.task_id, j.sequence, j.run_id, j.run_revision, j.ordinal, j.kind, j.state, j.payload
      FROM ${JOURNAL_ROW.unnest(rows, 'j')}
      ${onlyTasksOf === null ? sql.fragment`` : sql.fragment`WHERE j.task_id IN (SELECT task_id FROM ${onlyTasksOf})`}`;
}

/**
 * NOTIFYs each notice at commit; the count of notices sent, for a CTE of the caller's statement.
 * With `onlyTasksOf`, only the notices of the tasks that CTE names (a notice opens with its task).
 */
export function notifyAllStatement(notices: readonly string[], onlyTasksOf: IdentifierSqlToken | null = null) {
  return sql.fragment`SELECT count(pg_notify(${JOURNAL_CHANNEL}, notice))::int AS notified FROM unnest(${sql.array([...notices], 'text')}) AS notice
    ${onlyTasksOf === null ? sql.fragment`` : sql.fragment`WHERE split_part(notice, ' ', 1)::uuid IN (SELECT task_id FROM ${onlyTasksOf})`}`;
}

/**
 * The rows, watermark and NOTIFY payload of `events` written after the head at the run's
 * revision: every payload sealed under its own (task, sequence) context.
 */
export function journalRows(sealer: Sealer, head: JournalHead, run: CommittedRun, events: readonly JournalEventDraft[]) {
  const lastSequence = head.lastSequence + events.length;
  const rows: JournalRow[] = events.map((event, index) => {
    const sequence = head.lastSequence + index + 1;
    return JOURNAL_ROW.row({
      task_id: head.taskId,
      sequence,
      run_id: run.runId,
      run_revision: run.revision,
      ordinal: index,
      kind: event.kind,
      state: event.state,
      payload: sealer.sealJson(eventContext(head.taskId, sequence), event.response),
    });
  });
  const ends = events.some((event) => event.kind === 'message' || (event.state !== null && endsStream(event.state)));
  const notice = rows.length > 0 ? journalNotice(head.taskId, lastSequence, ends) : null;
  return { rows, lastSequence, notice, ends };
}

/** The push outbox of journaled events, in the transaction that journaled them: one delivery per config and event. */
export async function recordEventDeliveries(
  transaction: CommonQueryMethods,
  head: Pick<JournalHead, 'taskId' | 'lastSequence'>,
  events: readonly JournalEventDraft[],
  configs: readonly string[],
  options: ProjectionOptions,
): Promise<string[]> {
  if (configs.length === 0) return [];
  return recordDeliveriesFor(
    transaction,
    head.taskId,
    configs,
    events.map((event, index) => ({
      sequence: head.lastSequence + index + 1,
      terminal: event.state !== null && isTerminalState(event.state),
      // Any non-terminal status (INPUT_REQUIRED and AUTH_REQUIRED included): a newer state supersedes it.
      coalescible: event.kind === 'status' && event.state !== null && !isTerminalState(event.state),
    })),
    options.push,
  );
}
