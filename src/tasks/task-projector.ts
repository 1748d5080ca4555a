import { sql, type CommonQueryMethods, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { RunStatus, TerminationReason } from '../../machines/run.machine.js';
import type { KeelLogger } from '../log/logger.js';
import type { Sealer } from '../sealing/sealer.js';
import { listRunOutputs } from '../runs/run-output-repository.js';
import { recordDeliveriesFor } from '../push/delivery-repository.js';
import { endsStream, isTerminalState, isoTime, type Artifact, type Message, type StreamResponse, type TaskState } from '../protocol/wire.js';
import { eventContext, JOURNAL_CHANNEL, journalNotice } from './journal.js';
import { failureMetadata, failureStatusMessage } from './failure-status.js';
import { openSealed } from './task-repository.js';
import { taskStateOf } from './task-state.js';

// The projector turns committed run revisions into the journal (a2a_events) and the view's
// watermark (`a2a_tasks.projected_revision`). It never runs a model or a tool, reads only
// committed state, and is idempotent per revision: everything up to the run's current revision is
// projected at once under the task-row lock, and the watermark keeps a revision from being
// projected twice.

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

const projectionWrite = z.object({ updated: z.number(), inserted: z.number(), notified: z.boolean(), push_configs: z.array(z.string()) });

export type ProjectionResult = { taskId: string | null; events: number; revision: number; deliveryIds: string[] };

/** What the projector needs to write the push outbox with the journal. */
export type ProjectionOptions = { push: { deadlineHours: number; maxPendingPerConfig: number; maxPendingTotal: number } };

export const DEFAULT_PROJECTION_OPTIONS: ProjectionOptions = { push: { deadlineHours: 24, maxPendingPerConfig: 1000, maxPendingTotal: 100_000 } };

type PendingEvent = { kind: 'status' | 'artifact' | 'message'; state: TaskState | null; response: StreamResponse };

export async function projectRun(pool: DatabasePool, sealer: Sealer, runId: string, options: ProjectionOptions = DEFAULT_PROJECTION_OPTIONS): Promise<ProjectionResult> {
  return pool.transaction(async (transaction) => projectLocked(transaction, sealer, runId, options));
}

async function projectLocked(transaction: CommonQueryMethods, sealer: Sealer, runId: string, options: ProjectionOptions): Promise<ProjectionResult> {
  {
    // One statement: lock the task row (never the run row) and read the run's committed state. The
    // commit waits for its WAL flush like every other: its NOTIFY releases blocking answers, wakes
    // streams and makes deliveries due, so nothing it shows may be lost in a crash.
    const row = await transaction.maybeOne(sql.type(lockedTask.merge(runState))`
      SELECT t.id, t.context_id, t.projected_revision, t.last_sequence, t.projected_state, t.status_message, t.artifacts, t.direct_message,
        r.status, r.revision AS run_revision, r.started_at, r.status_changed_at, r.termination_reason, r.failure_detail,
        EXISTS (SELECT 1 FROM run_outputs o WHERE o.run_id = r.id AND o.kind = 'artifact') AS has_outputs
      FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
      WHERE t.run_id = ${runId} FOR UPDATE OF t`);
    if (!row) return { taskId: null, events: 0, revision: 0, deliveryIds: [] };
    const task = row;
    const run = { ...row, revision: row.run_revision };
    if (run.revision <= task.projected_revision) return { taskId: task.id, events: 0, revision: task.projected_revision, deliveryIds: [] };
    const outputs = task.has_outputs ? await listRunOutputs(transaction, sealer, runId) : [];


    const base = { taskId: task.id, contextId: task.context_id };
    const events: PendingEvent[] = [];
    const status = (state: TaskState, timestamp: number, message?: Message): PendingEvent => ({
      kind: 'status',
      state,
      response: { statusUpdate: { ...base, status: { state, ...(message ? { message } : {}), timestamp: isoTime(timestamp) } } },
    });
    let projected = task.projected_state as TaskState;
    const state = taskStateOf(run.status as RunStatus, run.failure_detail);

    if (projected === 'TASK_STATE_SUBMITTED' && run.started_at !== null && state !== 'TASK_STATE_SUBMITTED' && state !== 'TASK_STATE_REJECTED') {
      events.push(status('TASK_STATE_WORKING', run.started_at));
      projected = 'TASK_STATE_WORKING';
    }
    // A waiting run changes revision only by leaving the wait, so a run seen INPUT_REQUIRED again at
    // a newer revision took its input and asked for more before this projection: the journal still
    // shows it working in between (and a blocking follow-up sees the new INPUT_REQUIRED).
    const askedAgain = projected === 'TASK_STATE_INPUT_REQUIRED' && state === 'TASK_STATE_INPUT_REQUIRED';
    if (projected === 'TASK_STATE_INPUT_REQUIRED' && ((state !== 'TASK_STATE_INPUT_REQUIRED' && run.status !== 'queued') || askedAgain)) {
      events.push(status('TASK_STATE_WORKING', run.status_changed_at));
      projected = 'TASK_STATE_WORKING';
    }

    // Artifacts the agent emitted during the run, in the order they were committed.
    const emitted = outputs.filter(
      (output) => output.kind === 'artifact' && output.level !== 'metadata' && output.runRevision > task.projected_revision && output.runRevision <= run.revision,
    );
    for (const output of emitted) {
      const content = output.content as { name?: string; description?: string; parts?: Artifact['parts'] };
      events.push({
        kind: 'artifact',
        state: null,
        response: {
          artifactUpdate: {
            ...base,
            artifact: { artifactId: output.artifactId ?? `artifact-${output.ordinal}`, ...(content.name ? { name: content.name } : {}), parts: content.parts ?? [] },
            append: output.append,
            lastChunk: output.lastChunk,
          },
        },
      });
    }

    if (state !== projected) {
      const statusMessage = openSealed<Message | null>(sealer, task.id, 'status_message', task.status_message, null);
      if (state === 'TASK_STATE_COMPLETED' && task.direct_message && statusMessage) {
        const { taskId: _taskId, ...message } = statusMessage;
        events.push({ kind: 'message', state: 'TASK_STATE_COMPLETED', response: { message } });
      } else if (state === 'TASK_STATE_COMPLETED') {
        // The result written by the completion transaction: artifacts not already streamed.
        const streamed = new Set(outputs.filter((output) => output.kind === 'artifact').map((output) => output.artifactId));
        const artifacts = openSealed<Artifact[]>(sealer, task.id, 'artifacts', task.artifacts, []);
        for (const artifact of artifacts.filter((candidate) => !streamed.has(candidate.artifactId))) {
          events.push({ kind: 'artifact', state: null, response: { artifactUpdate: { ...base, artifact, lastChunk: true } } });
        }
        events.push(status(state, run.status_changed_at, statusMessage ?? undefined));
      } else {
        const reason = run.termination_reason as TerminationReason | null;
        const derived: Message | undefined =
          statusMessage ??
          (reason ? failureStatusMessage({ id: task.id, contextId: task.context_id }, `${task.id}-status-${run.revision}`, reason, run.failure_detail) : undefined);
        events.push(status(state, run.status_changed_at, state === 'TASK_STATE_WORKING' || state === 'TASK_STATE_SUBMITTED' ? undefined : derived));
        const metadata = failureMetadata(reason);
        if (metadata) {
          const last = events[events.length - 1]!.response as Extract<StreamResponse, { statusUpdate: unknown }>;
          last.statusUpdate.metadata = metadata;
        }
      }
    }

    // One statement writes the journal rows and the watermark, queues the NOTIFY (delivered at
    // commit) and reads the task's push configs (after the task-row lock, as a statement of its
    // own did): four round trips became one. The push outbox follows only when there are configs.
    const lastSequence = task.last_sequence + events.length;
    const rows = events.map((event, index) => {
      const sequence = task.last_sequence + index + 1;
      return [task.id, sequence, runId, run.revision, index, event.kind, event.state, sealer.sealJson(eventContext(task.id, sequence), event.response).toString('base64')] as const;
    });
    const ends = events.some((event) => event.kind === 'message' || (event.state !== null && endsStream(event.state)));
    const written = await transaction.one(sql.type(projectionWrite)`
      WITH ${
        rows.length > 0
          ? sql.fragment`journal AS (
        INSERT INTO a2a_events (task_id, sequence, run_id, run_revision, ordinal, kind, state, payload)
        SELECT task_id, sequence, run_id, run_revision, ordinal, kind, state, decode(payload, 'base64')
        FROM ${sql.unnest(rows.map((row) => [...row]), ['uuid', 'int4', 'uuid', 'int8', 'int4', 'text', 'text', 'text'])}
          AS t(task_id, sequence, run_id, run_revision, ordinal, kind, state, payload)
        RETURNING 1),`
          : sql.fragment``
      } watermark AS (
        UPDATE a2a_tasks SET projected_revision = ${run.revision}, last_sequence = ${lastSequence}, projected_state = ${state}
        WHERE id = ${task.id} RETURNING 1)
      SELECT
        (SELECT count(*) FROM watermark)::int AS updated,
        ${rows.length > 0 ? sql.fragment`(SELECT count(*) FROM journal)::int` : sql.fragment`0`} AS inserted,
        ${rows.length > 0 ? sql.fragment`pg_notify(${JOURNAL_CHANNEL}, ${journalNotice(task.id, lastSequence, ends)}) IS NOT NULL` : sql.fragment`false`} AS notified,
        ${
          rows.length > 0
            ? sql.fragment`ARRAY(SELECT id FROM push_configs WHERE task_id = ${task.id} AND deleted_at IS NULL AND state IN ('active', 'paused') ORDER BY id)`
            : sql.fragment`ARRAY[]::text[]`
        } AS push_configs`);
    if (written.updated !== 1 || written.inserted !== rows.length) {
      throw new Error(`projection of run ${runId}: wrote ${written.inserted} of ${rows.length} events and ${written.updated} watermarks`);
    }
    let deliveryIds: string[] = [];
    if (written.push_configs.length > 0) {
      // The push outbox, in the same transaction as the events it delivers.
      deliveryIds = await recordDeliveriesFor(
        transaction,
        task.id,
        written.push_configs,
        events.map((event, index) => ({
          sequence: task.last_sequence + index + 1,
          terminal: event.state !== null && isTerminalState(event.state),
          // Any non-terminal status (INPUT_REQUIRED and AUTH_REQUIRED included): a newer state supersedes it.
          coalescible: event.kind === 'status' && event.state !== null && !isTerminalState(event.state),
        })),
        options.push,
      );
    }
    return { taskId: task.id, events: events.length, revision: run.revision, deliveryIds };
  }
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

  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running.values()]);
  }
}
