import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { isConnectionError } from './pool.js';

/** How a piece of work that lost its connection is done again (`DatabaseReturn.again`). */
export type AgainOptions = {
  /** How long to wait for the database to answer, each time. */
  withinMs: number;
  /** How many times the work is done again at most. */
  times: number;
  /** Aborted at shutdown: no more waiting, the connection error is thrown. */
  stop?: AbortSignal;
  /** Told of each lost connection before the wait (a log line). */
  onLost?: (error: unknown) => void;
};

/**
 * Waits for the database to answer again after a lost connection (a crash, a restart, a cut
 * socket). One probe is in flight at a time, shared by every waiter: after a crash each run that
 * lost its write waits here, and sixteen of them must not probe sixteen times.
 */
export class DatabaseReturn {
  private probing: Promise<void> | null = null;

  constructor(
    private readonly pool: DatabasePool,
    private readonly intervalMs = 250,
  ) {}

  /** True as soon as a query answers; false when `withinMs` passed first or `stop` was aborted. */
  async answers(withinMs: number, stop?: AbortSignal): Promise<boolean> {
    const deadline = Date.now() + withinMs;
    for (;;) {
      if (stop?.aborted) return false;
      try {
        await this.probe();
        return true;
      } catch {
        // Refused (starting up, in recovery) or unreachable: probe again shortly.
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) return false;
      await new Promise((resolve) => setTimeout(resolve, Math.min(remaining, this.intervalMs)).unref());
    }
  }

  /**
   * `work`, done again once the database answers each time it fails with a lost connection (a
   * crash, a restart, a cut link), at most `times` times; any other error, or no answer within
   * `withinMs`, is thrown as it came. Only for work that reads what it needs again and whose
   * writes are guarded, so that a write that committed unseen is not made twice.
   */
  async again<T>(work: () => Promise<T>, options: AgainOptions): Promise<T> {
    for (let done = 0; ; done += 1) {
      try {
        return await work();
      } catch (error) {
        if (!isConnectionError(error) || done >= options.times) throw error;
        options.onLost?.(error);
        if (!(await this.answers(options.withinMs, options.stop))) throw error;
      }
    }
  }

  private probe(): Promise<void> {
    this.probing ??= this.pool
      .oneFirst(sql.type(z.object({ ok: z.number() }))`SELECT 1 AS ok`)
      .then(() => undefined)
      .finally(() => (this.probing = null));
    return this.probing;
  }
}
