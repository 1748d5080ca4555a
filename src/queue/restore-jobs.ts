/**
 * How many jobs a sweep restores at once. Each restore is a few queue round trips (look the job
 * up, read its state, add it), and one at a time a sweep after a Postgres cut that restored 86 run
 * jobs took 33-35 s on the loaded test machine, while the backlog it restored waited for it. The
 * restores are independent (each job has its own id), so the sweep keeps this many in flight: a
 * pool's worth on the Postgres queue, a pipeline's on Redis.
 */
export const RESTORE_CONCURRENCY = 16;

/**
 * Runs `restore` for every item, at most RESTORE_CONCURRENCY at a time, and counts the jobs it
 * added. The first failure stops the lanes from taking more items and is what the call rejects
 * with (the next sweep looks again, as after a failed sequential sweep).
 */
export async function restoreJobs<T>(items: readonly T[], restore: (item: T) => Promise<'added' | 'present'>): Promise<number> {
  let next = 0;
  let added = 0;
  let failed = false;
  const lane = async (): Promise<void> => {
    while (!failed && next < items.length) {
      const item = items[next]!;
      next += 1;
      try {
        if ((await restore(item)) === 'added') added += 1;
      } catch (error) {
        failed = true;
        throw error;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(RESTORE_CONCURRENCY, items.length) }, lane));
  return added;
}
