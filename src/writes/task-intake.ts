import type { DatabasePool } from 'slonik';
import type { KeelLogger } from '../log/logger.js';
import { createPushConfig, type NewPushConfig } from '../push/push-config-repository.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { enqueueRun } from '../runs/create-agent-run.js';
import type { FastRuns } from '../runs/fast-runs.js';
import type { TranscriptMessage } from '../providers/provider.js';
import type { RunRequest } from '../runs/run-request.js';
import type { CreateRunInput } from '../runs/run-repository.js';
import type { Sealer } from '../sealing/sealer.js';
import { MAX_WAITING_RANK, waitingRankOf } from '../tasks/waiting-tasks.js';
import type { ProjectionOptions } from '../tasks/journal-writer.js';
import { contextTranscript, ensureContext, type NewTask } from '../tasks/task-repository.js';
import { insertTaskWithRun, journalFastStart, type TaskCreator } from './task-creation.js';

// The one way a new task enters the write path (docs/architecture.md, "The write path"). The A2A
// service validates a message and says what the task is; the intake decides how it is written and
// where its run starts: with a free run slot of this process (the fast path, decision 0025) the run
// is inserted claimed by it and started here once the insert committed; otherwise it is QUEUED and
// its job added after the commit, ordered by its rank in its client's backlog (decision 0062). A
// first message in a new context is one row set for the creations' group commit (decision 0026);
// a message in a context with earlier turns, or with a push config, is a transaction of its own. Whether the fast path is on is decided once, at start
// (writePathFor): the intake is given this process's run slots or none.

export type TaskIntakeDeps = {
  pool: DatabasePool;
  sealer: Sealer;
  queues: KeelQueues;
  logger: KeelLogger;
  /** Writes new tasks in new contexts: together (group commit) or each alone (runs.directWrites). */
  creations: TaskCreator;
  /** This process's run slots, when the fast path is on here; null: every run takes the queue. */
  fastRuns: FastRuns | null;
  /** The push outbox's bounds, for the delivery of a fast run's WORKING event. */
  projectionOptions: ProjectionOptions;
  /** Wakes the push deliveries a new task's WORKING event wrote. */
  onDeliveries?: (deliveryIds: string[]) => Promise<void>;
};

/** A new task as the A2A service accepted it. */
export type NewTaskIntake = {
  task: NewTask & { sealedHistory: Buffer | null };
  run: Omit<CreateRunInput, 'request'> & { id: string; taskId: string; provider: string };
  /** The run's request, from the context's earlier turns (none for a new context). */
  request: (earlier: TranscriptMessage[]) => RunRequest;
  /** The message named an existing context: its earlier turns are read in the creating transaction. */
  inExistingContext: boolean;
  /** A push config sent with the message, created with the task. */
  pushConfig?: Omit<NewPushConfig, 'taskId' | 'owner'> | undefined;
};

/** Where the new task's journal is, for a blocking request to wait after. */
export type AcceptedTask = { taskId: string; afterSequence: number };

/**
 * The task written, or nothing written because its owner used the message key before (a repeat,
 * decided by the task row's INSERT: docs/decisions/0064-idempotent-messages-decided-at-insert.md).
 */
export type IntakeResult = { ok: true; task: AcceptedTask } | { ok: false; reason: 'key_used' };

export class TaskIntake {
  constructor(private readonly deps: TaskIntakeDeps) {}

  /** Whether this process starts new tasks' runs itself while it has a free slot. */
  get fastPath(): boolean {
    return this.deps.fastRuns !== null;
  }

  /**
   * Writes the task and its run, then starts the run here or enqueues it. `beforeWork` runs after
   * the commit and before the run can start (a blocking request subscribes to the journal there).
   * A repeated message key writes and starts nothing, and gives back the run slot it reserved.
   */
  async accept(intake: NewTaskIntake, beforeWork?: (taskId: string) => void): Promise<IntakeResult> {
    const { pool, sealer } = this.deps;
    const { task, run, pushConfig } = intake;
    const slot = this.deps.fastRuns?.reserve(task.owner) ?? null;
    const fast = slot && { claim: slot.claim, at: Date.now() };
    let request: RunRequest;
    let deliveries: string[] = [];
    let created: boolean;
    try {
      if (!intake.inExistingContext && !pushConfig) {
        // The common case, a first message: one row set, written with the other requests' creations.
        request = intake.request([]);
        // The spread last: a leading spread makes a hidden class per task (decision 0050).
        created = await this.deps.creations.create({ task, run: { request, ...run }, fast });
      } else {
        ({ request, created } = await pool.transaction(async (transaction) => {
          await ensureContext(transaction, task.owner, task.contextId);
          const earlier = intake.inExistingContext ? await contextTranscript(transaction, sealer, task.owner, task.contextId) : [];
          const asked = intake.request(earlier);
          if (!(await insertTaskWithRun(transaction, sealer, task, { request: asked, ...run }, fast, fast && { at: fast.at, journaled: null }))) {
            return { request: asked, created: false };
          }
          if (pushConfig) await createPushConfig(transaction, sealer, { taskId: task.id, owner: task.owner, ...pushConfig });
          // The WORKING event through the journal's writer: a push config created above gets its delivery.
          if (fast) deliveries = await journalFastStart(transaction, sealer, { id: task.id, contextId: task.contextId }, fast.at, this.deps.projectionOptions);
          return { request: asked, created: true };
        }));
      }
    } catch (error) {
      slot?.cancel();
      throw error;
    }
    if (!created) {
      slot?.cancel();
      return { ok: false, reason: 'key_used' };
    }
    beforeWork?.(task.id);
    if (slot && fast) {
      slot.start({
        id: task.id,
        agent: run.agent,
        taskId: task.id,
        auditLevel: run.auditLevel,
        answerLevel: run.answerLevel,
        provider: run.provider,
        request,
        at: fast.at,
        trace: run.trace ?? null,
        claimToken: fast.claim.token,
        task: { contextId: task.contextId, owner: task.owner, metadata: task.metadata, history: task.sealedHistory, pushConfigured: pushConfig !== undefined },
      });
      if (deliveries.length > 0) {
        await this.deps.onDeliveries?.(deliveries).catch((error: Error) => this.deps.logger.warn({ err: error, taskId: task.id }, 'push wake-ups for a new task failed; the sweeper adds them'));
      }
      // The insert journaled the task's WORKING event (sequence 1).
      return { ok: true, task: { taskId: task.id, afterSequence: 1 } };
    }
    // Its place in the queue: its rank in its client's backlog (decision 0062). A rank that cannot
    // be read puts it last of all ranks rather than failing a task that is written already.
    const rank = await waitingRankOf(pool, task.owner).catch(() => MAX_WAITING_RANK);
    await enqueueRun(this.deps.queues, task.id, { owner: task.owner, rank });
    return { ok: true, task: { taskId: task.id, afterSequence: 0 } };
  }
}
