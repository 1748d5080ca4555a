import { once } from 'node:events';
import { Counter, Gauge, Registry } from 'prom-client';
import type { KeelLogger } from '../log/logger.js';
import type { StreamResponse } from '../protocol/wire.js';
import type { TaskRevisionCacheStats } from '../tasks/task-revision-cache.js';

// Backpressure of A2A streams (docs/reliability.md, "Large tasks"). A stream holds at most
// `maxBufferedBytes` its client has not taken; at that bound it stops reading the journal and
// waits for the client. A client that takes nothing for `stallTimeoutMs` while the stream waits
// (or, once the stream has ended, while its last bytes wait) is cut off: the connection is reset,
// one log line says so and keel_a2a_stream_cutoffs_total counts it. Events waiting behind a
// stalled stream stay in the journal, not in memory.
//
// Payloads are shared, not copied per stream: each event's JSON is encoded once (eventJson) and a
// stream writes slices of that buffer, so a thousand streams of one large event hold one copy.

/** `keepAliveMs`: how often an SSE stream sends a comment line between events. */
export type StreamLimits = { maxBufferedBytes: number; stallTimeoutMs: number; keepAliveMs: number };
export type StreamBinding = 'sse' | 'grpc';
/** Why a stream was cut off: its buffer stayed full, or its last bytes were not taken after it ended. */
export type CutOffReason = 'stalled' | 'unflushed_end';

/** The largest slice of a shared payload written at once: a stalled stream holds at most the bound plus one slice. */
export const WRITE_SLICE_BYTES = 64 * 1024;

const eventJsonOf = new WeakMap<object, Buffer>();

/**
 * A stream event's JSON, encoded once per event object: the streams of one task share the events
 * of a journal read (shared-journal-reads.ts), so they share this buffer too.
 */
export function eventJson(response: StreamResponse): Buffer {
  let json = eventJsonOf.get(response);
  if (!json) {
    json = Buffer.from(JSON.stringify(response));
    eventJsonOf.set(response, json);
  }
  return json;
}

/** Resolves true when `emitter` emits 'drain', false after `timeoutMs` or when `signal` aborts. */
export async function drainedWithin(emitter: NodeJS.EventEmitter, timeoutMs: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return false;
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), timeoutMs);
  const onAbort = () => stop.abort();
  signal.addEventListener('abort', onAbort, { once: true });
  try {
    await once(emitter, 'drain', { signal: stop.signal });
    return true;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
    signal.removeEventListener('abort', onAbort);
  }
}

/** Bytes all of a process's streams write in one turn of the event loop before they let it take other work. */
export const WRITE_BYTES_PER_TURN = 512 * 1024;

export class StreamFlow {
  readonly registry = new Registry();
  readonly #cutoffs: Counter<'binding' | 'reason'>;
  #spentThisTurn = 0;
  #nextTurn: Promise<void> | null = null;

  constructor(
    readonly limits: StreamLimits,
    cacheStats: () => TaskRevisionCacheStats = () => ({ opened: 0, serialized: 0, hits: 0, joined: 0, bytes: 0, entries: 0 }),
  ) {
    const registers = [this.registry];
    this.#cutoffs = new Counter({
      name: 'keel_a2a_stream_cutoffs_total',
      help: 'A2A streams this process cut off because their client did not take what was sent (a2a.streams.maxBufferedBytes full for a2a.streams.stallTimeoutSeconds)',
      labelNames: ['binding', 'reason'],
      registers,
    });
    new Gauge({
      name: 'keel_a2a_task_cache_bytes',
      help: 'Bytes of task revisions this process keeps opened and serialized for concurrent readers (a2a.taskCacheBytes)',
      registers,
      collect() {
        this.set(cacheStats().bytes);
      },
    });
    new Gauge({
      name: 'keel_a2a_task_revisions_opened',
      help: 'Task revisions this process opened (unsealed) for readers since it started; concurrent readers of one revision share one opening',
      registers,
      collect() {
        this.set(cacheStats().opened);
      },
    });
  }

  /**
   * Waits, if this turn of the event loop has written its share, for the next one. Streams of one
   * revision resume together, and each write copies into the kernel: without a shared budget,
   * writing a large event to hundreds of streams would hold the event loop (and /healthz, and
   * every other request) for as long as all those copies take.
   */
  async pace(bytes: number): Promise<void> {
    while (this.#spentThisTurn >= WRITE_BYTES_PER_TURN) await this.#turn();
    if (this.#spentThisTurn === 0) void this.#turn();
    this.#spentThisTurn += bytes;
  }

  #turn(): Promise<void> {
    this.#nextTurn ??= new Promise((resolve) =>
      setImmediate(() => {
        this.#spentThisTurn = 0;
        this.#nextTurn = null;
        resolve();
      }),
    );
    return this.#nextTurn;
  }

  /** Counts and logs (once: this is called once per stream) a stream cut off. */
  cutOff(binding: StreamBinding, reason: CutOffReason, logger: KeelLogger, context: Record<string, unknown>): void {
    this.#cutoffs.inc({ binding, reason });
    logger.warn({ ...context, binding, reason, maxBufferedBytes: this.limits.maxBufferedBytes, stallTimeoutMs: this.limits.stallTimeoutMs }, 'stream cut off: its client did not take what was sent');
  }
}
