import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { RunStatus, TerminationReason } from '../../machines/run.machine.js';
import type { KeelLogger } from '../log/logger.js';
import type { Sealer } from '../sealing/sealer.js';
import { listRunOutputs } from '../runs/run-output-repository.js';
import type { Artifact, Message, TaskState } from '../protocol/wire.js';
import { DEFAULT_PROJECTION_OPTIONS, journalEventsSince, writeJournalEvents, type ProjectionOptions } from './journal-writer.js';
import { openSealed } from './task-repository.js';

// The projector turns committed run revisions into the journal (a2a_events) and the view's
// watermark (`a2a_tasks.projected_revision`). It never runs a model or a tool, reads only
// committed state, and is idempotent per revision: everything up to the run's current revision is
// projected at once under the task-row lock, and the watermark keeps a revision from being
// projected twice. A run's end is journaled by its completion transaction itself
// (docs/decisions/0022-completion-writes-the-journal.md): for such a revision the projector finds
// the watermark there already and writes nothing; it journals the transitions that have no
// completion of their own (claims, suspensions, resumptions, cancellations, requeues, failures
// settled elsewhere) and repairs whatever a crash left undone.

const lockedTask = z.object({
  has_outputs: z.boolean(),
  id: z.string(),
  context_id: z.string(),
  projected_revision: z.number(),
  last_sequence: z.number(),
  projected_state: z.string(),
  status_message: z.instanceof(Buffer).nullable(),
  artifacts: z.instanceof(Buffer).nullable(),
  direct_message: z.boolean(),
});
const runState = z.object({
  status: z.string(),
  run_revision: z.number(),
  started_at: z.number().nullable(),
  status_changed_at: z.number(),
  termination_reason: z.string().nullable(),
  failure_detail: z.record(z.unknown()).nullable(),
});

export type ProjectionResult = { taskId: string | null; events: number; revision: number; deliveryIds: string[] };

export async function projectRun(pool: DatabasePool, sealer: Sealer, runId: string, options: ProjectionOptions = DEFAULT_PROJECTION_OPTIONS): Promise<ProjectionResult> {
  return pool.transaction(async (transaction) => projectLocked(transaction, sealer, runId, options));
}

async function projectLocked(transaction: CommonQueryMethods, sealer: Sealer, runId: string, options: ProjectionOptions): Promise<ProjectionResult> {
  // One statement: lock the task row (never the run row) and read the run's committed state. The
  // commit waits for its WAL flush like every other: its NOTIFY releases blocking answers, wakes
  // streams and makes deliveries due, so nothing it shows may be lost in a crash.
  const row = await transaction.maybeOne(sql.type(lockedTask.merge(runState))`
    SELECT t.id, t.context_id, t.projected_revision, t.last_sequence, t.projected_state, t.status_message, t.artifacts, t.direct_message,
      r.status, r.revision AS run_revision, r.started_at, r.status_changed_at, r.termination_reason, r.failure_detail,
      EXISTS (SELECT 1 FROM run_outputs o WHERE o.run_id = r.id AND o.kind IN ('artifact', 'status')) AS has_outputs
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
    WHERE t.run_id = ${runId} FOR UPDATE OF t`);
  if (!row) return { taskId: null, events: 0, revision: 0, deliveryIds: [] };
  if (row.run_revision <= row.projected_revision) return { taskId: row.id, events: 0, revision: row.projected_revision, deliveryIds: [] };
  const outputs = row.has_outputs ? await listRunOutputs(transaction, sealer, runId) : [];
  const head = {
    taskId: row.id,
    contextId: row.context_id,
    projectedRevision: row.projected_revision,
    lastSequence: row.last_sequence,
    projectedState: row.projected_state as TaskState,
    directMessage: row.direct_message,
    statusMessage: () => openSealed<Message | null>(sealer, row.id, 'status_message', row.status_message, null),
    artifacts: () => openSealed<Artifact[]>(sealer, row.id, 'artifacts', row.artifacts, []),
  };
  const run = {
    runId,
    status: row.status as RunStatus,
    revision: row.run_revision,
    startedAt: row.started_at,
    statusChangedAt: row.status_changed_at,
    terminationReason: row.termination_reason as TerminationReason | null,
    failureDetail: row.failure_detail,
  };
  const written = await writeJournalEvents(transaction, sealer, head, run, journalEventsSince(head, run, outputs), options);
  return { taskId: row.id, events: written.events, revision: run.revision, deliveryIds: written.deliveryIds };
}

/**
 * In-process projection right after a commit, one at a time per run (the sweeper and the projector
 * queue repair anything this misses: a crash between commit and projection loses nothing).
 */
const COALESCE_MS = 2;

export class ProjectionScheduler {
  private readonly running = new Map<string, Promise<void>>();
  private readonly again = new Set<string>();
  private readonly sleepers = new Map<string, () => void>();
  private readonly journaledAlready = new Set<string>();

  constructor(
    private readonly pool: DatabasePool,
    private readonly sealer: Sealer,
    private readonly logger: KeelLogger,
    private readonly options: ProjectionOptions = DEFAULT_PROJECTION_OPTIONS,
    private readonly afterProjection: (result: ProjectionResult) => Promise<void> = async () => undefined,
  ) {}

  /**
   * Projects the run soon. `delayMs` lets the commits of a fast run share one projection: the
   * executor waits a little after a claim (a run that completes meanwhile is projected once, with
   * its WORKING state first) and not at all after a settle.
   */
  wake(runId: string, delayMs = 0): void {
    this.journaledAlready.delete(runId);
    const sleeping = this.sleepers.get(runId);
    if (sleeping) {
      // A settle arrived while a claim's projection was still waiting for it: project now, once.
      if (delayMs === 0) sleeping();
      return;
    }
    if (this.running.has(runId)) {
      this.again.add(runId);
      return;
    }
    const work = (async () => {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, Math.max(delayMs, COALESCE_MS));
        function done() {
          clearTimeout(timer);
          resolve();
        }
        this.sleepers.set(runId, done);
      });
      this.sleepers.delete(runId);
      // The run's settle journals everything up to its end itself (or wakes the projector again).
      if (this.journaledAlready.delete(runId)) return;
      do {
        this.again.delete(runId);
        try {
          await this.afterProjection(await projectRun(this.pool, this.sealer, runId, this.options));
        } catch (error) {
          this.logger.warn({ err: error, runId }, 'projection failed; the sweeper will retry it');
          break;
        }
      } while (this.again.has(runId));
    })().finally(() => this.running.delete(runId));
    this.running.set(runId, work);
  }

  /**
   * The run's settle is about to journal its end, with every revision before it
   * (docs/decisions/0022-completion-writes-the-journal.md): a projection still waiting to coalesce
   * with that settle (a claim's) would only wait for the settle's locks to find nothing to write,
   * so it is dropped. A settle that then journals nothing wakes the projector again.
   */
  settling(runId: string): void {
    const sleeping = this.sleepers.get(runId);
    if (!sleeping) return;
    this.journaledAlready.add(runId);
    sleeping();
  }

  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running.values()]);
  }
}
