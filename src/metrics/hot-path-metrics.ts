import { Counter, Histogram, Registry } from 'prom-client';

// What the hot path does in this process, counted as it happens (the rest of /metrics is read
// from Postgres at scrape time): how runs were started (the fast path or the queue,
// docs/decisions/0025-fast-path.md) and how many writes each group commit carried
// (docs/decisions/0026-group-commit.md; one statement may carry both kinds, decision 0048). Per
// process, since a restart begins at zero: rates and ratios, not totals, are what to read from them.

export type RunStartPath = 'fast' | 'queue';
export type BatchKind = 'creation' | 'completion';

const BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64];
/** Seconds: a lone write on a local database takes about a millisecond, a batch under load several. */
const WRITE_TIME_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1];

export class HotPathMetrics {
  readonly registry = new Registry();
  private readonly runsStarted: Counter<'path'>;
  private readonly batches: Histogram<'kind'>;
  private readonly waits: Histogram<'kind'>;
  private readonly writes: Histogram<'kind'>;

  constructor() {
    const registers = [this.registry];
    this.runsStarted = new Counter({
      name: 'keel_runs_started_total',
      help: 'Runs this process started, by path: fast (inserted claimed by the process that received the task) or queue (claimed from the runs queue)',
      labelNames: ['path'],
      registers,
    });
    this.batches = new Histogram({
      name: 'keel_group_commit_batch_size',
      help: 'Writes per group commit in this process: new tasks per statement that creates tasks, runs per statement or transaction that completes them (a statement carrying both kinds counts under each)',
      labelNames: ['kind'],
      buckets: BATCH_BUCKETS,
      registers,
    });
    this.waits = new Histogram({
      name: 'keel_group_commit_wait_seconds',
      help: 'How long each write waited for its group commit to start (every lane busy with an earlier batch)',
      labelNames: ['kind'],
      buckets: WRITE_TIME_BUCKETS,
      registers,
    });
    this.writes = new Histogram({
      name: 'keel_group_commit_write_seconds',
      help: 'How long each group commit took, from its start to its answer: the statement built (sealing included), sent, run and committed',
      labelNames: ['kind'],
      buckets: WRITE_TIME_BUCKETS,
      registers,
    });
  }

  runStarted(path: RunStartPath): void {
    this.runsStarted.inc({ path });
  }

  batch(kind: BatchKind, size: number): void {
    this.batches.observe({ kind }, size);
  }

  /** A batch was written: each of its writes' wait and the batch's own time, in milliseconds. */
  batchWritten(kind: BatchKind, waitedMs: readonly number[], writeMs: number): void {
    const waits = this.waits.labels({ kind });
    for (const waited of waitedMs) waits.observe(waited / 1000);
    this.writes.observe({ kind }, writeMs / 1000);
  }
}
