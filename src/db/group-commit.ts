import { context, ROOT_CONTEXT, SpanKind, trace, type Link, type SpanContext } from '@opentelemetry/api';
import { inSpan } from '../tracing/keel-tracer.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';
import { isConnectionError } from './pool.js';

// Group commit (docs/decisions/0026-group-commit.md): the writes of concurrent requests that are
// ready at the same moment go to the database together, as one batch (one statement or one
// transaction, as the batch's writer decides), so N tasks pay one round trip and one WAL flush
// instead of N. There is no timer: a lone item is written at once (on the next turn of the event
// loop, which only gathers what arrived in the same turn), and items arriving while a batch is in
// flight form the next batch, flushed as soon as the previous one returns. A batch whose writer
// fails with an error of its own (not a lost connection) is written again item by item, so one bad
// item fails alone and every other item of its batch is written.

/** How a group commit batches and what it reports, as its owner configures it. */
export type BatchOptions<I = unknown> = {
  /** At most this many items per batch (a bound on statement size and transaction length). */
  maxBatch: number;
  /**
   * Group commit off (`runs.directWrites`, for diagnosis): each item is written alone as soon as
   * it is submitted, by `writeOne`, concurrently with the others; `lanes` does not bound them.
   */
  direct?: boolean;
  /**
   * How many batches may be in flight at once, each on its own connection (1: one at a time).
   * Items wait only while every lane is busy, so a lone item is still written at once.
   */
  lanes?: number;
  /**
   * A lane beyond the first starts only when at least this many items wait (none: whenever one is
   * free). One lane gathers the most per batch; a backlog this long (a load one lane cannot keep
   * up with, or a batch held up by a lock) opens the others.
   */
  spareLaneBacklog?: number;
  /** Called once per flushed batch with its size (metrics). */
  onBatch?: (size: number) => void;
  /**
   * Called once per batch after it was written (committed, or failed and retried item by item):
   * how long each item waited for its batch to start, and how long the batch took from its start
   * to its last item's answer, in milliseconds (metrics: where a write's time goes), with the
   * batch's items (for a writer whose items are of several kinds, task-write-batch.ts).
   */
  onWritten?: (waitedMs: readonly number[], writeMs: number, items: readonly I[]) => void;
};

export type BatchWriter<I, R> = BatchOptions<I> & {
  /** Writes all items together; the results are in the items' order. */
  writeBatch: (items: readonly I[]) => Promise<readonly R[]>;
  /** Writes one item alone: a batch of one, and the retry of an item of a batch that failed. */
  writeOne: (item: I) => Promise<R>;
  /** Each item of a batch that rolled back, before it is written again alone (to give back what the attempt took). */
  rolledBack?: (item: I) => void;
  /**
   * Whether a lane, its batch written, lets the event loop turn once before it takes the next
   * batch: the writes its batch's callers make next (a completion after a creation) go with it.
   */
  gatherAfterBatch?: boolean;
  /**
   * While tracing is on, each batch is one span of this name (a root: a batch serves many traces)
   * with a link to each item's trace: `linkOf`'s, else the span that was active when the item was
   * submitted (the run's stretch, for a completion).
   */
  trace?: { name: string; linkOf?: (item: I) => Link | null };
};

type Pending<I, R> = { item: I; resolve: (result: R) => void; reject: (error: unknown) => void; submittedAt: number; from: SpanContext | undefined };

export class GroupCommit<I, R> {
  private queue: Pending<I, R>[] = [];
  private inFlight = 0;
  private scheduled = false;
  private readonly lanes: number;

  constructor(private readonly writer: BatchWriter<I, R>) {
    this.lanes = Math.max(1, writer.lanes ?? 1);
  }

  /** Writes the item with whatever else is ready; resolves once its batch (or its own retry) committed. */
  submit(item: I): Promise<R> {
    if (this.writer.direct) return this.writeAlone(item);
    return new Promise<R>((resolve, reject) => {
      const from = this.writer.trace && tracingEnabled() ? trace.getSpanContext(context.active()) : undefined;
      this.queue.push({ item, resolve, reject, submittedAt: performance.now(), from });
      this.schedule();
    });
  }

  private async writeAlone(item: I): Promise<R> {
    this.writer.onBatch?.(1);
    const startedAt = performance.now();
    const result = await this.writer.writeOne(item);
    this.writer.onWritten?.([0], performance.now() - startedAt, [item]);
    return result;
  }

  private schedule(): void {
    if (this.inFlight >= this.lanes || this.scheduled) return;
    this.scheduled = true;
    // Not a timer: the items that arrived in this turn of the event loop go together.
    setImmediate(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  /** Starts a batch on every free lane; each lane takes the next batch as soon as its own returns. */
  private flush(): void {
    while (this.inFlight < this.lanes && this.queue.length > 0 && (this.inFlight === 0 || this.queue.length >= (this.writer.spareLaneBacklog ?? 1))) {
      this.inFlight += 1;
      void this.lane().finally(() => {
        this.inFlight -= 1;
        if (this.queue.length > 0) this.schedule();
      });
    }
  }

  private async lane(): Promise<void> {
    for (let first = true; ; first = false) {
      if (!first && this.writer.gatherAfterBatch) await new Promise<void>((resolve) => setImmediate(resolve));
      if (this.queue.length === 0) return;
      const batch = this.queue.splice(0, this.writer.maxBatch);
      this.writer.onBatch?.(batch.length);
      const startedAt = performance.now();
      await (this.writer.trace && tracingEnabled() ? this.tracedWrite(this.writer.trace, batch) : this.write(batch));
      const { onWritten } = this.writer;
      if (onWritten)
        onWritten(
          batch.map((pending) => startedAt - pending.submittedAt),
          performance.now() - startedAt,
          batch.map((pending) => pending.item),
        );
    }
  }

  /** The batch's write inside its span, linked to the trace of each item it carries. */
  private tracedWrite(traced: NonNullable<BatchWriter<I, R>['trace']>, batch: Pending<I, R>[]): Promise<void> {
    const links: Link[] = [];
    for (const pending of batch) {
      const link = traced.linkOf?.(pending.item) ?? (pending.from && trace.isSpanContextValid(pending.from) ? { context: pending.from } : null);
      if (link) links.push(link);
    }
    return inSpan(traced.name, { kind: SpanKind.INTERNAL, links, attributes: { 'keel.batch.size': batch.length } }, ROOT_CONTEXT, () => this.write(batch));
  }

  private async write(batch: Pending<I, R>[]): Promise<void> {
    if (batch.length === 1) {
      const [only] = batch;
      await this.writer.writeOne(only!.item).then(only!.resolve, only!.reject);
      return;
    }
    let results: readonly R[];
    try {
      results = await this.writer.writeBatch(batch.map((pending) => pending.item));
    } catch (error) {
      // A lost connection leaves the batch's outcome unknown: writing its items again could write
      // them twice, so each caller gets the error, as it would have alone.
      if (isConnectionError(error)) {
        for (const pending of batch) {
          this.writer.rolledBack?.(pending.item);
          pending.reject(error);
        }
        return;
      }
      // The batch rolled back as a whole: each item again on its own, so only the bad one fails.
      for (const pending of batch) this.writer.rolledBack?.(pending.item);
      // One after another, inside this lane: the lanes stay the bound on transactions in flight.
      for (const pending of batch) await this.writer.writeOne(pending.item).then(pending.resolve, pending.reject);
      return;
    }
    if (results.length !== batch.length) {
      const error = new Error(`group commit: the batch writer returned ${results.length} results for ${batch.length} items`);
      for (const pending of batch) pending.reject(error);
      return;
    }
    batch.forEach((pending, index) => pending.resolve(results[index]!));
  }
}
