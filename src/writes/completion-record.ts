import type { RunRow } from '../runs/run-row.js';
import { auditRowsOf, type AuditRow, type SerializedRow } from '../runs/audit-trail.js';
import { settleRow } from '../runs/run-repository.js';
import type { StoredRunOutput } from '../runs/run-output-repository.js';
import type { ShapedRow } from '../db/row-shape.js';
import type { Artifact, Message } from '../protocol/wire.js';
import type { Sealer } from '../sealing/sealer.js';
import { journalEventsSince, journalRows, type CommittedRun, type JournalEventDraft, type JournalHead, type JournalWrite } from '../tasks/journal-writer.js';
import { prepareTaskResult, taskResultRow, type TaskRow } from '../tasks/task-repository.js';
import { mergeArtifacts } from '../tasks/merge-artifacts.js';
import type { CompletionInput, JournaledEnd, KnownRows, SettledRun } from './completion-input.js';

// The completion record: everything a run's completion writes, built in one place from the run's
// outcome and its rows as the writer knows them (docs/architecture.md, "The write path"). Every
// writer of a completion takes its rows from here: the held statement of a fast run
// (complete-held-runs.ts), the batch of completions in one transaction (complete-runs-together.ts)
// and a completion alone (complete-run.ts, through the same batch writer). Their statements differ
// in shape (one statement that checks what it expects under its lock, or a lock then a write);
// what they write does not. A field a completion writes is added here, once.

/** What a completion writes: its rows for each table, in the row shapes the statements send (row-shape.ts). */
export type CompletionRecord = {
  runId: string;
  taskId: string;
  /** The run's revision after the settle. */
  revision: number;
  /** The status time of the settle, the task's state and the COMPLETED event, one value. */
  at: number;
  /** The run's last audit rows, written with its end (what could be refused, `beforeSettle` writes). */
  audit: AuditRow[];
  /** The task's sealed result, state and journal watermark (writeTaskResultsStatement). */
  result: ShapedRow;
  /** The run's settle (completeRunsStatement). */
  settle: ShapedRow;
  /** The journal's events from the watermark to the end, and their sealed rows and NOTIFY. */
  events: JournalEventDraft[];
  journal: ReturnType<typeof journalRows>;
  /** The result as stored (the blocking answer shows it without opening it again). */
  stored: ReturnType<typeof prepareTaskResult>;
  directMessage: boolean;
  known: KnownRows;
};

/**
 * The task's result for the agent's answer: the run's merged artifacts, then the answer as an
 * artifact of its own, or as the status message (a direct Message when presented as one).
 */
export function answerResult(
  taskId: string,
  contextId: string,
  input: Pick<CompletionInput, 'answer' | 'presentation'>,
  merged: Artifact[],
): { artifacts: Artifact[]; statusMessage: Message | null; directMessage: boolean } {
  const presentation = input.presentation ?? 'artifact';
  const artifacts = [...merged];
  if (presentation === 'artifact' && input.answer !== null) artifacts.push({ artifactId: `${taskId}-answer`, name: 'answer', parts: [{ text: input.answer }] });
  const statusMessage: Message | null =
    presentation !== 'artifact' && input.answer !== null ? { messageId: `${taskId}-answer`, role: 'ROLE_AGENT', parts: [{ text: input.answer }], contextId, taskId } : null;
  return { artifacts, statusMessage, directMessage: presentation === 'direct_message' };
}

/** The journal's head as the known rows leave it, with the content the end will store. */
export function journalHeadOf(
  taskId: string,
  known: Pick<KnownRows, 'projectedRevision' | 'lastSequence' | 'projectedState'> & { task: Pick<KnownRows['task'], 'contextId'> },
  content: { directMessage: boolean; statusMessage: () => Message | null; artifacts: () => Artifact[] },
): JournalHead {
  return {
    taskId,
    contextId: known.task.contextId,
    projectedRevision: known.projectedRevision,
    lastSequence: known.lastSequence,
    projectedState: known.projectedState,
    directMessage: content.directMessage,
    statusMessage: content.statusMessage,
    artifacts: content.artifacts,
  };
}

/**
 * The completion record of a run serving a task: its result (the merged `outputs` and the
 * answer) sealed at the known answer level, its settle, its audit rows and the journal's events
 * from the known watermark to COMPLETED, every one stamped `at`.
 */
export function completionRecord(
  sealer: Sealer,
  input: CompletionInput,
  known: KnownRows,
  at: number,
  outputs: readonly StoredRunOutput[],
  audit: readonly SerializedRow[],
): CompletionRecord {
  const taskId = input.taskId!;
  const revision = known.runRevision + 1;
  const { artifacts, statusMessage, directMessage } = answerResult(taskId, known.task.contextId, input, mergeArtifacts(outputs));
  const stored = prepareTaskResult(sealer, taskId, known.answerLevel, { artifacts, statusMessage, directMessage }, known.task.history);
  const head = journalHeadOf(taskId, known, { directMessage, statusMessage: () => stored.statusMessage, artifacts: () => stored.artifacts });
  const run: CommittedRun = {
    runId: input.runId,
    status: 'completed',
    revision,
    startedAt: known.startedAt,
    statusChangedAt: at,
    terminationReason: input.reason,
    failureDetail: null,
  };
  const events = journalEventsSince(head, run, outputs);
  const journal = journalRows(sealer, head, run, events);
  return {
    runId: input.runId,
    taskId,
    revision,
    at,
    audit: auditRowsOf(input.runId, audit),
    result: taskResultRow({ taskId, stored, directMessage, answerLevel: known.answerLevel, revision, lastSequence: journal.lastSequence, at }),
    settle: settleRow({ runId: input.runId, holder: input.holder, reason: input.reason, totals: input.totals, at }),
    events,
    journal,
    stored,
    directMessage,
    known,
  };
}

/** The task row a journaled end leaves, built from what its transaction wrote (the blocking answer's source). */
export function journaledTaskRow(
  task: Pick<KnownRows['task'], 'contextId' | 'owner' | 'agent' | 'metadata' | 'createdAt'>,
  settled: Pick<RunRow, 'id' | 'task_id' | 'termination_reason' | 'failure_detail'>,
  write: Pick<JournalWrite, 'state' | 'statusTimestamp' | 'revision' | 'lastSequence'>,
  content: { sealed: { statusMessage: Buffer | null; artifacts: Buffer | null; history: Buffer | null }; answerLevel: string; directMessage: boolean },
): TaskRow {
  return {
    id: settled.task_id!,
    context_id: task.contextId,
    owner: task.owner,
    agent: task.agent,
    run_id: settled.id,
    state: write.state,
    status_timestamp: write.statusTimestamp,
    status_message: content.sealed.statusMessage,
    artifacts: content.sealed.artifacts,
    history: content.sealed.history,
    answer_level: content.answerLevel,
    metadata: task.metadata,
    projected_revision: write.revision,
    last_sequence: write.lastSequence,
    projected_state: write.state,
    direct_message: content.directMessage,
    created_at: task.createdAt,
    termination_reason: settled.termination_reason,
    failure_detail: settled.failure_detail,
  };
}

/** The end a committed record journaled, for the blocking answer: the journal write and the task row it left. */
export function journaledEndOf(record: CompletionRecord, settled: SettledRun, deliveryIds: string[]): JournaledEnd {
  const { journal } = record;
  const write: JournalWrite = {
    events: record.events.length,
    revision: record.revision,
    deliveryIds,
    notice: journal.notice === null ? null : { taskId: record.taskId, lastSequence: journal.lastSequence, ends: journal.ends },
    state: 'TASK_STATE_COMPLETED',
    statusTimestamp: record.at,
    lastSequence: journal.lastSequence,
  };
  const content = { sealed: record.stored.sealed, answerLevel: record.known.answerLevel, directMessage: record.directMessage };
  return { write, task: journaledTaskRow(record.known.task, settled, write, content) };
}
