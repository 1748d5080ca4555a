import type { DatabasePool } from 'slonik';
import { getRun } from '../../src/runs/run-repository.js';
import type { RunRow } from '../../src/runs/run-row.js';

export async function waitFor<T>(probe: () => Promise<T | null | undefined | false>, what: string, timeoutMs = 30_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

export async function waitForRunStatus(pool: DatabasePool, runId: string, statuses: readonly string[], timeoutMs = 30_000): Promise<RunRow> {
  return waitFor(
    async () => {
      const run = await getRun(pool, runId);
      return run && statuses.includes(run.status) ? run : null;
    },
    `run ${runId} to reach ${statuses.join('|')}`,
    timeoutMs,
  );
}
