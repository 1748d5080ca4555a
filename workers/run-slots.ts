import type { LeaseKeeper } from '../src/runs/lease-keeper.js';
import type { FastRun, FastRunSlot } from '../src/runs/fast-runs.js';
import { newClaimToken, type Claim } from '../src/runs/run-repository.js';
import type { ExecutionReport } from './run-execution.js';

// The run executor's slot scheduler: which runs this process has in flight, how queued and fast
// runs share runs.concurrency, the fast path's fairness towards the queue, the slots kept free for
// clients (decision 0062), and the drain at shutdown. It decides and counts; what a run does in
// its slot is the executor's.

/** A run in flight: its lease keeper once it has one (released at the end of a drain), and when it leaves. */
export type Slot = { lease: LeaseKeeper | null; done: Promise<void> };

/**
 * How long a full queue share keeps the fast path to half the slots unless seen full again: a
 * bound in case the queue's worker never reports it drained (the queue ran dry on another process).
 */
const QUEUE_BACKLOG_MS = 1000;

/**
 * Fair run slots (decision 0062): a client with no run in flight here that was seen within this
 * long (a task of it received, or a run of it ended) finds a slot kept free for it: the queue's
 * worker and other clients' new tasks leave one slot per such client, so its next task starts at
 * once on the fast path instead of waiting for another client's run to end.
 */
const CLIENT_ACTIVE_MS = 2000;

export type RunSlotsOptions = {
  /** How many runs this process may take at insert (the fast path); 0 turns it off. */
  fastSlots?: number;
  /** The bound fast and queued runs share (runs.concurrency). */
  concurrency?: number;
  /**
   * Told how many runs the queue's worker may have in flight whenever that changes: what fast runs
   * and the slots kept free for clients leave, at least one.
   */
  onQueueShare?: (slots: number) => void;
};

/** A client with runs in this process, or seen here lately. */
type ClientSlots = { inFlight: number; lastSeen: number };

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
  /** Clients by id: runs in flight here, and when last seen (tasks received, runs ended). */
  private readonly clients = new Map<string, ClientSlots>();
  /** At most this many slots are kept free for clients: a quarter of them. */
  private readonly keptFreeMax: number;
  private publishedQueueShare = -1;

  constructor(private readonly options: RunSlotsOptions) {
    this.fastSlots = options.fastSlots ?? 0;
    this.sharedSlots = options.concurrency ?? this.fastSlots + 1;
    // Only the fast path can start a run in a slot kept free: without it nothing is kept.
    this.keptFreeMax = this.fastSlots > 0 ? Math.floor(this.sharedSlots / 4) : 0;
  }

  /** Slots kept free now for clients seen lately with no run in flight here (for /metrics). */
  get keptFree(): number {
    return this.keptFreeFor(null, Date.now());
  }

  /** Shutting down: no run is started any more. */
  get isDraining(): boolean {
    return this.draining;
  }

  /** A run woken by the queue, in a slot of its own; skipped while draining. `owner`: its client, when its job names it. */
  async queued(runId: string, work: (slot: Slot) => Promise<ExecutionReport>, owner?: string): Promise<ExecutionReport> {
    if (this.draining) return { kind: 'skipped' };
    const now = Date.now();
    const client = owner === undefined ? null : this.seen(owner, now);
    this.queuedInFlight += 1;
    if (client) client.inFlight += 1;
    if (this.queueSaturated(now)) this.queueBacklogUntil = now + QUEUE_BACKLOG_MS;
    this.publishQueueShare(now);
    return this.inSlot(runId, work).finally(() => {
      this.queuedInFlight -= 1;
      this.left(client);
    });
  }

  /**
   * Fast runs: reserved before their task is written, counted until they leave the executor. A
   * reservation that is never started or cancelled would hold a slot for good, so a reservation
   * is a one-shot object.
   */
  reserveFast(claim: Claim, handling: FastRunHandling, owner: string): FastRunSlot | null {
    const now = Date.now();
    const client = this.seen(owner, now);
    // Fairness: once the queue's share was full, runs may be waiting in the queue (requeued,
    // resumed, received by another process). Fast runs, which would take every slot as it frees
    // up, then hold at most half the slots until the queue's worker finds it empty (BullMQ's
    // 'drained'), so the queue's runs always get the other half.
    if (this.queueSaturated(now)) this.queueBacklogUntil = now + QUEUE_BACKLOG_MS;
    const limit = now < this.queueBacklogUntil ? Math.min(this.fastSlots, Math.floor(this.sharedSlots / 2)) : this.fastSlots;
    // A free slot: fast and queued runs in flight share runs.concurrency. A client with runs in
    // flight here leaves the slots kept free for the others seen lately with none (decision 0062);
    // a client with none may take any free slot, a kept one included: it is one of those they are for.
    const inUse = this.fastInFlight + this.queuedInFlight;
    const keptForOthers = client.inFlight > 0 ? this.keptFreeFor(owner, now) : 0;
    if (this.draining || this.fastInFlight >= limit || inUse + 1 + keptForOthers > this.sharedSlots) {
      this.publishQueueShare(now);
      return null;
    }
    client.inFlight += 1;
    this.fastChanged(1);
    let used = false;
    const release = () => {
      this.left(client);
      this.fastChanged(-1);
    };
    return {
      // A token of its own: the run's claim at insert is a claim like any other (decision 0088).
      claim: { ...claim, token: newClaimToken() },
      start: (run) => {
        if (used) return;
        used = true;
        // Shutting down since the slot was taken: the run goes back to the queue for another worker.
        const work = this.draining ? handling.handBack(run) : this.inSlot(run.id, (slot) => handling.run(run, slot));
        void work.finally(release);
      },
      cancel: () => {
        if (used) return;
        used = true;
        release();
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

  /** The queue's share: what fast runs and the slots kept free for clients leave, at least one. */
  private queueShare(now: number): number {
    return Math.max(1, this.sharedSlots - this.fastInFlight - this.keptFreeFor(null, now));
  }

  private queueSaturated(now: number): boolean {
    return this.queuedInFlight >= this.queueShare(now);
  }

  /**
   * How many slots are kept free for clients other than `except` (null: for every client): one per
   * client seen within CLIENT_ACTIVE_MS with no run in flight here, at most a quarter of the slots.
   * Clients gone quiet are forgotten here.
   */
  private keptFreeFor(except: string | null, now: number): number {
    if (this.keptFreeMax === 0) return 0;
    let owed = 0;
    for (const [owner, client] of this.clients) {
      if (client.inFlight > 0) continue;
      if (now - client.lastSeen > CLIENT_ACTIVE_MS) this.clients.delete(owner);
      else if (owner !== except) owed += 1;
    }
    return Math.min(owed, this.keptFreeMax);
  }

  private seen(owner: string, now: number): ClientSlots {
    let client = this.clients.get(owner);
    if (!client) {
      client = { inFlight: 0, lastSeen: now };
      this.clients.set(owner, client);
    }
    client.lastSeen = now;
    return client;
  }

  /** A run of `client` (null: of a client the job did not name) left its slot. */
  private left(client: ClientSlots | null): void {
    const now = Date.now();
    if (client) {
      client.inFlight -= 1;
      client.lastSeen = now;
    }
    this.publishQueueShare(now);
  }

  private fastChanged(delta: number): void {
    this.fastInFlight += delta;
    this.publishQueueShare(Date.now());
  }

  /** Tells the queue's worker its share when it changed. */
  private publishQueueShare(now: number): void {
    const share = this.queueShare(now);
    if (share === this.publishedQueueShare) return;
    this.publishedQueueShare = share;
    this.options.onQueueShare?.(share);
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
