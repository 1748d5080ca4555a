import type { Job } from 'bullmq';
import type { ArtifactEmission } from '../src/providers/provider.js';
import type { LoopOutcome, LoopState } from '../machines/agent-loop.machine.js';
import type { FastRuns } from '../src/runs/fast-runs.js';
import type { RetryPolicy } from '../src/runs/provider-chain.js';
import type { CompletionBatch } from '../src/writes/completion-batch.js';
import type { HeldRows, JournaledEnd } from '../src/writes/completion-input.js';
import type { RegisteredAgent } from '../src/agents/agent-registry.js';
import type { KeelLogger } from '../src/log/logger.js';
import type { AuditTrail } from '../src/runs/audit-trail.js';
import type { LateWriteFence } from '../src/runs/late-write-fence.js';
import type { LeaseKeeper } from '../src/runs/lease-keeper.js';
import type { Holder } from '../src/runs/run-repository.js';
import type { RunRow } from '../src/runs/run-row.js';
import type { LocalCommit } from '../src/tasks/journal-listener.js';
import type { ProjectionOptions } from '../src/tasks/journal-writer.js';

// What the run executor's parts share: its options, what it reports of a run, and how it tells
// the rest of the process of its commits (run-executor.ts wires them; run-slots.ts schedules,
// run-steps.ts drives, run-settling.ts writes the end).

export type ExecutorOptions = RetryPolicy & {
  leaseMs: number;
  heartbeatMs: number;
  /**
   * The fast path (docs/decisions/0025-fast-path.md): how many runs this process may take at
   * insert, besides the queue's. 0 turns it off. The queue's worker is told its share
   * (`onQueueShare`: what fast runs and the slots kept free for clients leave), so queued and fast
   * runs share one bound.
   */
  fastSlots?: number;
  onQueueShare?: (slots: number) => void;
  /** The bound both kinds share (runs.concurrency): the queue's share is what fast runs leave, at least one. */
  concurrency?: number;
  /** Completions written together with other runs' (group commit); without it each has its own transaction. */
  completions?: CompletionBatch;
  /** Told of every run this executor starts, and by which path (metrics). */
  onRunStarted?: (path: 'fast' | 'queue') => void;
  /** The push outbox's bounds, for the deliveries a run's end writes with its journal rows. */
  projection?: ProjectionOptions;
  /**
   * Subscribes to the cancels NOTIFYd by cancelRun (the run's id, or null when some may have been
   * missed); returns the unsubscribe. Without it a cancel is noticed at the next lease renewal.
   */
  cancelNotices?: (onCancel: (runId: string | null) => void) => () => void;
};

/** How a run's loop or machine ended, with the state to settle it from (and a statechart output's artifacts). */
export type DrivenRun = { outcome: LoopOutcome; state: LoopState; artifacts: readonly ArtifactEmission[] };

export type ExecutionReport =
  | { kind: 'skipped' }
  | { kind: 'settled'; status: 'completed' | 'failed'; reason: string }
  | { kind: 'suspended'; status: string }
  | { kind: 'stopped'; why: 'lease_lost' | 'cancelled' };

/**
 * Called after each commit that changed the run (the projector turns revisions into journal
 * events); `settleSoon` marks a claim, after which a fast run usually settles within moments.
 */
export type AfterCommit = (runId: string, settleSoon?: boolean) => void;

/**
 * How the process hears of a run's end that the settling transaction journaled itself
 * (docs/decisions/0022-completion-writes-the-journal.md).
 */
export type EndJournaling = {
  /**
   * Before the transaction: a projection of the run still waiting to coalesce is dropped (the
   * settle journals what it would have), and this process's blocking requests for the task await
   * the transaction's outcome.
   */
  begin: (runId: string, taskId: string) => LocalCommit;
  /** After its COMMIT returned: its deliveries are woken. */
  journaled: (runId: string, end: JournaledEnd) => Promise<void>;
};

export const NO_END_JOURNALING: EndJournaling = {
  begin: () => ({ committed: () => undefined, unknown: () => undefined }),
  journaled: async () => undefined,
};

export type RunExecutor = {
  execute: (runId: string) => Promise<ExecutionReport>;
  /**
   * Graceful shutdown: waits up to `graceMs` for runs in flight, then releases the rest (back to
   * QUEUED for another worker, without counting a requeue).
   */
  drain: (graceMs: number) => Promise<{ finished: number; released: number }>;
  /** A `runs` job: the run's id, and its client when the job was added for a new task (decision 0062). */
  processor: (job: Job<{ runId: string; owner?: string }>) => Promise<ExecutionReport>;
  /** Slots this process keeps free now for clients seen lately with no run in flight here (/metrics). */
  keptFreeSlots: () => number;
  /** Slots for runs inserted already claimed by this process (src/runs/fast-runs.ts). */
  fastRuns: FastRuns;
  /** The queue's worker found no job waiting: new tasks may take the fast path again. */
  queueDrained: () => void;
};

/** A run this process holds, as its steps and its settling see it (one per drive of the run). */
export type RunInHand = {
  run: RunRow;
  runId: string;
  /** The claim this drive holds the run under: every write of the run carries it (decision 0088). */
  holder: Holder;
  /** The writes of this claim the database refused because the run's claim changed, recorded in its timeline when the drive ends. */
  fence: LateWriteFence;
  agent: RegisteredAgent;
  audit: AuditTrail;
  lease: LeaseKeeper;
  runLog: KeelLogger;
  /** The rows a fast run's completion checks instead of reading them (fast-run-rows.ts), or null. */
  held: HeldRows | null;
  /** How many artifacts the run stored (1 when it may have stored some before this drive: completion then reads them). */
  storedOutputs: number;
  /** The step the run is waiting for now (a cancel's timeline event names it), or null between steps. */
  current: RunningStepName | null;
  /** Where the run's cancel found it (set when the cancel is noticed). */
  cancelledDuring: RunningStepName | { step: 'between_steps' } | null;
};

/** A step in flight, as a cancel's timeline event names it. */
export type RunningStepName = { step: 'tool' | 'model' | 'step'; name: string; callId?: string };
