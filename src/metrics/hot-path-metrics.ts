import { Counter, Histogram, Registry } from 'prom-client';

// What the hot path does in this process, counted as it happens (the rest of /metrics is read
// from Postgres at scrape time): how runs were started (the fast path or the queue,
// docs/decisions/0025-fast-path.md) and how many writes each group commit carried
// (docs/decisions/0026-group-commit.md). Per process, since a restart begins at zero: rates and
// ratios, not totals, are what to read from them.

export type RunStartPath = 'fast' | 'queue';
export type BatchKind = 'creation' | 'completion';

const BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64];

export class HotPathMetrics {
  readonly registry = new Registry();
  private readonly runsStarted: Counter<'path'>;
  private readonly batches: Histogram<'kind'>;

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
      help: 'Writes per group commit in this process: new tasks per creation statement, runs per completion transaction',
      labelNames: ['kind'],
      buckets: BATCH_BUCKETS,
      registers,
    });
  }

  runStarted(path: RunStartPath): void {
    this.runsStarted.inc({ path });
  }

  batch(kind: BatchKind, size: number): void {
    this.batches.observe({ kind }, size);
  }
}
