// How many tasks each client has that are not in a terminal state (its concurrent runs), as this
// process knows it without a database read per request (docs/decisions/0060): the exact counts
// read at the last refresh (`read`, one statement over the task-count tables) plus the tasks this
// process accepted since. A refresh runs every second while the process serves clients, and at
// once (awaited, shared by every request waiting for it) when a client reaches its limit on a count
// older than FRESH_MS, so a client is refused only on a recent count. The end of a task whose
// blocking request this process answers counts at once; any other end is learnt from the next
// refresh, and so are another process's new tasks.
//
// The accepted tasks are kept in two generations: those committed before the refresh in flight
// began are in its snapshot and dropped when it lands; those committed later may or may not be
// (counted twice until the next refresh). A client with such a task is not exactly counted: at its
// limit it is read again before it is refused, so a task that may be counted twice never refuses
// the next one (it did, once, in CI: a blocking task answered, the next refused with 429).

/** A count older than this is refreshed before a client at its limit is refused. */
export const FRESH_MS = 250;
/** How often the counts are read while the process serves clients. */
export const REFRESH_EVERY_MS = 1000;

export type ReadActiveCounts = () => Promise<ReadonlyMap<string, number>>;

const add = (counts: Map<string, number>, owner: string, n: number) => {
  const next = (counts.get(owner) ?? 0) + n;
  if (next === 0) counts.delete(owner);
  else counts.set(owner, next);
};

export class ActiveRunCounts {
  #base: ReadonlyMap<string, number> = new Map();
  /** Accepted and not yet committed (or given up). */
  readonly #pending = new Map<string, number>();
  /** Committed since the refresh in flight (or the last one) began. */
  #recent = new Map<string, number>();
  /** Committed before the refresh in flight began: in its snapshot. */
  readonly #older = new Map<string, number>();
  #refreshedAt = Number.NEGATIVE_INFINITY;
  #refreshing: Promise<void> | null = null;
  /** Owners with a task committed while the refresh in flight reads (maybe in its snapshot too). */
  #committedInFlight: Set<string> | null = null;
  /** Owners with a task committed while the last refresh read: their counts may be one high. */
  #maybeTwice: ReadonlySet<string> = new Set();

  constructor(
    private readonly read: ReadActiveCounts,
    private readonly now: () => number = Date.now,
    private readonly onError: (error: unknown) => void = () => undefined,
  ) {}

  /** The client's tasks not in a terminal state, as this process counts them. */
  count(owner: string): number {
    return (this.#base.get(owner) ?? 0) + (this.#pending.get(owner) ?? 0) + (this.#older.get(owner) ?? 0) + (this.#recent.get(owner) ?? 0);
  }

  /** Whether the count was read within FRESH_MS. */
  get fresh(): boolean {
    return this.now() - this.#refreshedAt <= FRESH_MS;
  }

  /** Whether the owner's count is exact: none of its tasks was committed while the last refresh read. */
  exactFor(owner: string): boolean {
    return !this.#maybeTwice.has(owner);
  }

  /** Counts a task being accepted; `settle(true)` once it is committed, `settle(false)` when it was not. */
  reserve(owner: string): (committed: boolean) => void {
    add(this.#pending, owner, 1);
    let settled = false;
    return (committed) => {
      if (settled) return;
      settled = true;
      add(this.#pending, owner, -1);
      if (committed) {
        add(this.#recent, owner, 1);
        this.#committedInFlight?.add(owner);
      }
    };
  }

  /**
   * A task of the owner's ended and this process saw it (a blocking request's answer): it stops
   * counting now, not at the next refresh. Called at most once per task this process accepted.
   * Should a refresh that began after the end was committed land before this call, the end is
   * counted twice until the refresh after: the count is one low for at most a second.
   */
  ended(owner: string): void {
    add(this.#recent, owner, -1);
  }

  /** Reads the counts again; concurrent callers share one read. A failed read keeps the old counts. */
  refresh(): Promise<void> {
    this.#refreshing ??= this.#refresh().finally(() => (this.#refreshing = null));
    return this.#refreshing;
  }

  async #refresh(): Promise<void> {
    const startedAt = this.now();
    for (const [owner, n] of this.#recent) add(this.#older, owner, n);
    this.#recent = new Map();
    const committedInFlight = new Set<string>();
    this.#committedInFlight = committedInFlight;
    try {
      this.#base = await this.read();
      this.#older.clear();
      this.#refreshedAt = startedAt;
      this.#maybeTwice = committedInFlight;
    } catch (error) {
      this.onError(error);
    } finally {
      this.#committedInFlight = null;
    }
  }
}
