import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';

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

  private probe(): Promise<void> {
    this.probing ??= this.pool
      .oneFirst(sql.type(z.object({ ok: z.number() }))`SELECT 1 AS ok`)
      .then(() => undefined)
      .finally(() => (this.probing = null));
    return this.probing;
  }
}
