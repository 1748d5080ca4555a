import type { LeaseKeeper } from '../src/runs/lease-keeper.js';
import type { FastRun, FastRunSlot } from '../src/runs/fast-runs.js';
import type { Claim } from '../src/runs/run-repository.js';
import type { ExecutionReport } from './run-execution.js';

// The run executor's slot scheduler: which runs this process has in flight, how queued and fast
// runs share runs.concurrency, the fast path's fairness towards the queue, and the drain at
// shutdown. It decides and counts; what a run does in its slot is the executor's.

/** A run in flight: its lease keeper once it has one (released at the end of a drain), and when it leaves. */
export type Slot = { lease: LeaseKeeper | null; done: Promise<void> };

/**
 * How long a full queue share keeps the fast path to half the slots unless seen full again: a
 * bound in case the queue's worker never reports it drained (the queue ran dry on another process).
 */
const QUEUE_BACKLOG_MS = 1000;

export type RunSlotsOptions = {
  /** How many runs this process may take at insert (the fast path); 0 turns it off. */
  fastSlots?: number;
  /** The bound fast and queued runs share (runs.concurrency). */
  concurrency?: number;
  /** Told how many fast runs are in flight after each change (the queue's worker takes what they leave). */
  onFastRuns?: (inFlight: number) => void;
};

/** What a reserved fast slot does with its run: runs it in the slot, or hands it back when the process began draining meanwhile. Neither rejects. */
export type FastRunHandling = {
  run: (run: FastRun, slot: Slot) => Promise<void>;
  handBack: (run: FastRun) => Promise<void>;
};

export class RunSlots {
  private readonly inFlight = new Map<string, Slot>();
  private draining = false;
  /** Runs taken from the queue now in flight (for the fast path's fairness rule below). */
  private queuedInFlight = 0;
  /** Until then the queue may hold waiting runs: new tasks take the queue. */
  private queueBacklogUntil = 0;
  private fastInFlight = 0;
  private readonly fastSlots: number;
  private readonly sharedSlots: number;

  constructor(private readonly options: RunSlotsOptions) {
    this.fastSlots = options.fastSlots ?? 0;
    this.sharedSlots = options.concurrency ?? this.fastSlots + 1;
  }

  /** Shutting down: no run is started any more. */
  get isDraining(): boolean {
    return this.draining;
  }

  /** A run woken by the queue, in a slot of its own; skipped while draining. */
  async queued(runId: string, work: (slot: Slot) => Promise<ExecutionReport>): Promise<ExecutionReport> {
    if (this.draining) return { kind: 'skipped' };
    this.queuedInFlight += 1;
    if (this.queueSaturated()) this.queueBacklogUntil = Date.now() + QUEUE_BACKLOG_MS;
    return this.inSlot(runId, work).finally(() => (this.queuedInFlight -= 1));
  }

  /**
   * Fast runs: reserved before their task is written, counted until they leave the executor. A
   * reservation that is never started or cancelled would hold a slot for good, so a reservation
   * is a one-shot object.
   */
  reserveFast(claim: Claim, handling: FastRunHandling): FastRunSlot | null {
    // Fairness: once the queue's share was full, runs may be waiting in the queue (requeued,
    // resumed, received by another process). Fast runs, which would take every slot as it frees
    // up, then hold at most half the slots until the queue's worker finds it empty (BullMQ's
    // 'drained'), so the queue's runs always get the other half.
    if (this.queueSaturated()) this.queueBacklogUntil = Date.now() + QUEUE_BACKLOG_MS;
    const limit = Date.now() < this.queueBacklogUntil ? Math.min(this.fastSlots, Math.floor(this.sharedSlots / 2)) : this.fastSlots;
    // A free slot: fast and queued runs in flight share runs.concurrency.
    if (this.draining || this.fastInFlight >= limit || this.fastInFlight + this.queuedInFlight >= this.sharedSlots) return null;
    this.fastChanged(1);
    let used = false;
    return {
      claim,
      start: (run) => {
        if (used) return;
        used = true;
        // Shutting down since the slot was taken: the run goes back to the queue for another worker.
        const work = this.draining ? handling.handBack(run) : this.inSlot(run.id, (slot) => handling.run(run, slot));
        void work.finally(() => this.fastChanged(-1));
      },
      cancel: () => {
        if (used) return;
        used = true;
        this.fastChanged(-1);
      },
    };
  }

  /** The queue's worker found no job waiting: new tasks may take the fast path again. */
  queueDrained(): void {
    this.queueBacklogUntil = 0;
  }

  /** Stops starting runs, waits up to `graceMs` for those in flight, then releases the rest's leases and waits for them to leave. */
  async drain(graceMs: number): Promise<{ finished: number; released: number }> {
    this.draining = true;
    const before = this.inFlight.size;
    const all = Promise.all([...this.inFlight.values()].map((entry) => entry.done));
    await Promise.race([all, new Promise((resolve) => setTimeout(resolve, graceMs).unref())]);
    const remaining = [...this.inFlight.values()];
    for (const entry of remaining) entry.lease?.release();
    await Promise.all(remaining.map((entry) => entry.done));
    return { finished: before - remaining.length, released: remaining.length };
  }

  private queueSaturated(): boolean {
    return this.queuedInFlight >= Math.max(1, this.sharedSlots - this.fastInFlight);
  }

  private fastChanged(delta: number): void {
    this.fastInFlight += delta;
    this.options.onFastRuns?.(this.fastInFlight);
  }

  private async inSlot<T>(runId: string, work: (slot: Slot) => Promise<T>): Promise<T> {
    let finish: () => void = () => undefined;
    const slot: Slot = { lease: null, done: new Promise<void>((resolve) => (finish = resolve)) };
    this.inFlight.set(runId, slot);
    try {
      return await work(slot);
    } finally {
      this.inFlight.delete(runId);
      finish();
    }
  }
}
