import type { CommonQueryMethods } from 'slonik';
import type { AnswerPresentation } from '../../machines/agent-loop.machine.js';
import type { CompletionReason, TerminationReason } from '../../machines/run.machine.js';
import type { SerializedRow } from '../runs/audit-trail.js';
import type { NewRunOutput } from '../runs/run-output-repository.js';
import type { Holder, RunTotals, SettleResult } from '../runs/run-repository.js';
import type { RunRow } from '../runs/run-row.js';
import type { JournalWrite, ProjectionOptions } from '../tasks/journal-writer.js';
import type { TaskRow } from '../tasks/task-repository.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { TaskState } from '../protocol/wire.js';

// What a run's end hands the write path, and what the write path answers: the types every writer
// of an end shares (complete-run.ts, complete-runs-together.ts, complete-held-runs.ts,
// uncommon-ends.ts), apart from the code, so none of them imports another for its types.

/**
 * A run's and its task's rows as a completion's writer knows them before it writes: as a fast
 * run's insert left them (held, never read) or as read under the writer's lock.
 */
export type KnownRows = {
  /** The run's revision before the settle. */
  runRevision: number;
  answerLevel: PrivacyLevel;
  /** When the run started (null: never claimed). */
  startedAt: number | null;
  /** The journal's head: its watermark, last sequence and state. */
  projectedRevision: number;
  lastSequence: number;
  projectedState: TaskState;
  task: { contextId: string; owner: string; agent: string; metadata: Record<string, unknown>; history: Buffer | null; createdAt: number };
};

/**
 * What the completion of a held run expects its run and task rows to be (a fast run: as its
 * insert wrote them; complete-held-runs.ts): the rows its completion record is built from.
 */
export type HeldRows = KnownRows & { startedAt: number };

export type CompletionInput = {
  runId: string;
  /** The claim the run is held under: every write of the completion carries it (decision 0088). */
  holder: Holder;
  reason: CompletionReason;
  answer: string | null;
  presentation?: AnswerPresentation;
  totals: RunTotals;
  /** Runs inside the completion transaction first (the audit trail's last events). */
  beforeSettle?: (transaction: CommonQueryMethods) => Promise<unknown>;
  /**
   * The audit trail's last events as rows that can ride in the statement writing the task's result
   * (AuditTrail.takeUnrefusableRows; null when one could be refused); what it does not take,
   * beforeSettle writes. Given the transaction they ride in, which gives them back if it rolls back
   * (before a retry too); a statement committed on its own passes none, and `rolledBack` gives back.
   */
  takeAuditRows?: (transaction?: CommonQueryMethods) => SerializedRow[] | null;
  /** The run serves this A2A task (runs.task_id), so task and run are locked together. */
  taskId: string | null;
  /** False when the run stored no artifacts: nothing to merge into the result or to journal. */
  hasOutputs: boolean;
  /**
   * Artifacts that are part of the result itself (a statechart agent's output), written under the
   * completion's lock at the revision its settle reaches, then merged and journaled with the rest.
   */
  resultOutputs?: readonly NewRunOutput[];
  /** The push outbox's bounds, for the deliveries written with the journal. */
  projection?: ProjectionOptions;
  /**
   * The run and task rows as this process knows them without reading (a fast run's insert): the
   * completion is then written by one statement that checks them under its lock
   * (complete-held-runs.ts, decision 0029), and by the transaction only when they changed.
   */
  held?: HeldRows;
  /**
   * The transaction these writes rode in rolled back (a batch it shared with other runs failed):
   * what it took from the run (its audit rows) is given back before the completion is written again.
   */
  rolledBack?: () => void;
};

/**
 * A run's end as its own transaction journaled it: the journal write (events, deliveries, the
 * NOTIFY) and the task row as that transaction left it, built from what it wrote, for answering a
 * blocking request in this process once the COMMIT has returned.
 */
export type JournaledEnd = { write: JournalWrite; task: TaskRow };

/**
 * What a completion tells its caller of the run it settled: what the caller and the journal's
 * answer read, so a completion need not return (and parse) the whole row.
 */
export type SettledRun = Pick<RunRow, 'id' | 'task_id' | 'status' | 'termination_reason' | 'failure_detail'>;

/** The settle, and the journal write that came with it (null when nothing was journaled). */
export type CompletionResult = ({ settled: true; run: SettledRun } | Extract<SettleResult, { settled: false }>) & { journaled: JournaledEnd | null };

export type FailureInput = {
  runId: string;
  holder: Holder;
  reason: TerminationReason;
  errorClass?: string | null;
  failureDetail?: Record<string, unknown> | null;
  /** The task's status message for the failure (sealed at the run's answer level); without it, the one derived from the reason. */
  statusText?: string;
  totals?: RunTotals;
  /** The run serves this A2A task (runs.task_id): then the failure is journaled with the settle. */
  taskId: string | null;
  /** False when the run stored no artifacts: none to journal. */
  hasOutputs: boolean;
  projection?: ProjectionOptions;
};
