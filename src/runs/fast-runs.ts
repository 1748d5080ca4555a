import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { HeldClaim } from './run-repository.js';
import type { RunRequest } from './run-request.js';
import type { RunTrace } from '../tracing/run-trace.js';

// The fast path (docs/decisions/0025-fast-path.md): a new task received by a process that runs
// workers and has a free run slot is run by that process. The API side reserves a slot before it
// writes the task, inserts the run already claimed under the slot's claim, and starts it once the
// insert committed; no queue job is added. The executor (workers/run-executor.ts) implements it.

/** The run as the fast path inserted it, with its request in the clear (it was sealed for the row, not read back). */
export type FastRun = {
  id: string;
  agent: string;
  taskId: string;
  auditLevel: PrivacyLevel;
  answerLevel: PrivacyLevel;
  provider: string | null;
  request: RunRequest;
  /** When it was created and started (`runs.started_at = runs.created_at`). */
  at: number;
  /** Its place in its task's trace, as its row stores it (null while tracing is off). */
  trace?: RunTrace | null;
  /** The token its insert stamped as its claim's (`runs.claim_token`): every write of the run carries it. */
  claimToken: string;
  /**
   * Its task as the same insert wrote it (WORKING since `at`, its WORKING event journaled), with
   * the history's sealed bytes: the completion writes against this without reading the task first
   * (src/writes/complete-held-runs.ts), and answers from it.
   */
  task: {
    contextId: string;
    owner: string;
    metadata: Record<string, unknown>;
    history: Buffer | null;
    /** A push config was written with the task: its deliveries need the completion transaction. */
    pushConfigured: boolean;
  };
};

/** A run slot held for a task about to be created; exactly one of `start` or `cancel` must follow. */
export type FastRunSlot = {
  /** The claim the run is inserted under: this process's worker id and lease, and a new token for this run. */
  claim: HeldClaim;
  /** The run's insert committed: run it here. */
  start: (run: FastRun) => void;
  /** The insert failed or was not made: the slot is free again. */
  cancel: () => void;
};

export type FastRuns = {
  /**
   * A free run slot of this process for a task of client `owner`, or null (none free, the slots
   * left kept for other clients, draining): the task then takes the queue.
   */
  reserve: (owner: string) => FastRunSlot | null;
};
