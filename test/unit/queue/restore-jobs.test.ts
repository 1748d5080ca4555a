import { describe, expect, it } from 'vitest';
import { RESTORE_CONCURRENCY, restoreJobs } from '../../../src/queue/restore-jobs.js';

const tick = () => new Promise((resolve) => setTimeout(resolve, 1));

describe('restoreJobs (a sweep restoring lost jobs)', () => {
  it('restores every item once, counts the jobs it added, and never has more than RESTORE_CONCURRENCY in flight', async () => {
    const items = Array.from({ length: 100 }, (_, i) => i);
    const seen: number[] = [];
    let inFlight = 0;
    let most = 0;
    const added = await restoreJobs(items, async (item) => {
      inFlight += 1;
      most = Math.max(most, inFlight);
      await tick();
      seen.push(item);
      inFlight -= 1;
      return item % 3 === 0 ? 'present' : 'added';
    });
    expect(seen.sort((a, b) => a - b)).toEqual(items);
    expect(added).toBe(items.filter((item) => item % 3 !== 0).length);
    expect(most).toBe(RESTORE_CONCURRENCY);
  });

  it('restores nothing for no items', async () => {
    expect(await restoreJobs([], async () => 'added')).toBe(0);
  });

  it('rejects with the first failure and takes no item after it', async () => {
    const items = Array.from({ length: 100 }, (_, i) => i);
    const started: number[] = [];
    const call = restoreJobs(items, async (item) => {
      started.push(item);
      await tick();
      if (item === 5) throw new Error('queue unreachable');
      return 'added';
    });
    await expect(call).rejects.toThrow('queue unreachable');
    // The lanes in flight at the failure finish their item; none takes another.
    await tick();
    await tick();
    expect(started.length).toBeLessThan(2 * RESTORE_CONCURRENCY);
  });
});
