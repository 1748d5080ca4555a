import type { ClientLimitsConfig, ClientLimitValues } from '../config/config-schema.js';
import { REFRESH_EVERY_MS, type ActiveRunCounts } from './active-run-counts.js';
import { TokenBucket } from './token-bucket.js';

// Per-client limits (docs/reliability.md, "Per-client limits"; decision 0060): requests per second
// with a burst, requests in flight, open streams and concurrent runs, each a default
// (`limits.default`) or the client's own (`limits.clients.<name>`). The gate of every binding
// admits a request after authenticating it; a stream takes a stream slot; a new task takes a run.
// Everything but the run counts is this process's memory: behind N API processes a client gets N
// times the rate, the requests in flight and the streams (decision 0060 says why).

export type LimitKind = 'requestsPerSecond' | 'concurrentRequests' | 'openStreams' | 'concurrentRuns';
export const LIMIT_KINDS: readonly LimitKind[] = ['requestsPerSecond', 'concurrentRequests', 'openStreams', 'concurrentRuns'];

/**
 * The wait a refusal names when nothing says when a slot frees (requests in flight, streams, runs):
 * the shortest Retry-After can say, and the run counts' refresh period.
 */
export const SLOT_RETRY_SECONDS = Math.ceil(REFRESH_EVERY_MS / 1000);

/** A client as the gate knows it after authentication. */
export type LimitedClient = { id: string; name: string };

/** What refused a request: the limit, the client's values and the wait to name. */
export type LimitRefusal = { kind: LimitKind; limits: ClientLimitValues; retryAfterSeconds: number };

/**
 * A refusal as the caller's error (the A2A service makes it an A2A error, src/a2a/client-limit-error.ts:
 * this folder stays below the bindings and knows no wire shape).
 */
export type Refused<E> = { ok: false; error: E };

/** A request admitted: it holds a request slot until `release` (idempotent) or until it becomes a stream. */
export type RequestAdmission<E> = {
  release: () => void;
  /** Takes one of the client's stream slots for this request's stream and gives back its request slot; `close` frees the stream slot (idempotent). */
  openStream: () => { ok: true; close: () => void } | Refused<E>;
};

type ClientState = {
  limits: ClientLimitValues;
  bucket: TokenBucket;
  requests: number;
  streams: number;
};

export type ClientLimitsOptions<E> = {
  /** Turns a refusal into the error a refused request gets. */
  refuse: (refusal: LimitRefusal) => E;
  /** The clients' tasks not in a terminal state; none: concurrentRuns is not enforced (a process that takes no tasks). */
  runs: ActiveRunCounts | null;
  now?: () => number;
  /** Each refusal, by the limit that refused (the /metrics counter). */
  onRefused?: (kind: LimitKind) => void;
};

export class ClientLimits<E> {
  readonly #clients = new Map<string, ClientState>();
  readonly #now: () => number;
  #timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly config: ClientLimitsConfig,
    private readonly options: ClientLimitsOptions<E>,
  ) {
    this.#now = options.now ?? Date.now;
  }

  /** A client's limits: its own (`limits.clients.<name>`) over the default. */
  limitsFor(name: string): ClientLimitValues {
    const own = Object.hasOwn(this.config.clients, name) ? this.config.clients[name] : undefined;
    return own ? { ...this.config.default, ...own } : this.config.default;
  }

  #state(client: LimitedClient): ClientState {
    let state = this.#clients.get(client.id);
    if (!state) {
      const limits = this.limitsFor(client.name);
      state = { limits, bucket: new TokenBucket(limits.requestsPerSecond, limits.burst, this.#now()), requests: 0, streams: 0 };
      this.#clients.set(client.id, state);
    }
    return state;
  }

  #refuse(kind: LimitKind, limits: ClientLimitValues, retryAfterSeconds: number): Refused<E> {
    this.options.onRefused?.(kind);
    return { ok: false, error: this.options.refuse({ kind, limits, retryAfterSeconds }) };
  }

  /**
   * Admits one request of an authenticated client: a token of its rate, a slot of its requests in
   * flight. A request refused for its concurrency takes no token.
   */
  admitRequest(client: LimitedClient): { ok: true; admission: RequestAdmission<E> } | Refused<E> {
    const state = this.#state(client);
    const { limits } = state;
    if (state.requests >= limits.concurrentRequests) return this.#refuse('concurrentRequests', limits, SLOT_RETRY_SECONDS);
    const token = state.bucket.take(this.#now());
    if (!token.ok) return this.#refuse('requestsPerSecond', limits, Math.max(1, Math.ceil(token.waitSeconds)));
    state.requests += 1;
    let holdsRequest = true;
    const release = () => {
      if (!holdsRequest) return;
      holdsRequest = false;
      state.requests -= 1;
    };
    const openStream = (): { ok: true; close: () => void } | Refused<E> => {
      if (state.streams >= limits.openStreams) return this.#refuse('openStreams', limits, SLOT_RETRY_SECONDS);
      state.streams += 1;
      release();
      let open = true;
      return {
        ok: true,
        close: () => {
          if (!open) return;
          open = false;
          state.streams -= 1;
        },
      };
    };
    return { ok: true, admission: { release, openStream } };
  }

  /**
   * Starts a client's new task when it has fewer than its concurrentRuns not in a terminal state;
   * `start` writes it. Below the limit this reads nothing; at the limit a count older than a
   * quarter second is read again first (ActiveRunCounts).
   */
  async startRun<T>(clientId: string, start: () => Promise<T>): Promise<{ ok: true; value: T } | Refused<E>> {
    const runs = this.options.runs;
    if (!runs) return { ok: true, value: await start() };
    const limits = this.#clients.get(clientId)?.limits ?? this.config.default;
    // Read again before refusing on a stale count, or on one that may hold a task twice; twice at
    // most (the first may be a refresh already in flight that began before the last commit).
    for (let read = 0; read < 2 && runs.count(clientId) >= limits.concurrentRuns && (!runs.fresh || !runs.exactFor(clientId)); read += 1) await runs.refresh();
    if (runs.count(clientId) >= limits.concurrentRuns) return this.#refuse('concurrentRuns', limits, SLOT_RETRY_SECONDS);
    const settle = runs.reserve(clientId);
    let committed = false;
    try {
      const value = await start();
      committed = true;
      return { ok: true, value };
    } finally {
      settle(committed);
    }
  }

  /** A new task's end seen by the blocking request that created it: the client's run is free at once. */
  runEnded(clientId: string): void {
    this.options.runs?.ended(clientId);
  }

  /** Forgets clients with nothing in flight whose bucket is full again: their state is a new client's. */
  prune(): void {
    const now = this.#now();
    for (const [id, state] of this.#clients) {
      if (state.requests === 0 && state.streams === 0 && state.bucket.full(now)) this.#clients.delete(id);
    }
  }

  /** Refreshes the run counts every second while some client is known here, and prunes. */
  start(): void {
    if (this.#timer) return;
    this.#timer = setInterval(() => {
      this.prune();
      if (this.#clients.size > 0) void this.options.runs?.refresh();
    }, REFRESH_EVERY_MS);
    this.#timer.unref();
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** Clients with state here (for tests). */
  get trackedClients(): number {
    return this.#clients.size;
  }
}
