import { sep } from 'node:path';

// What the suite calls a fault file: a file under test/faults/. The sequencer plans them one at a
// time (suite-sequencer.ts), and each holds the fault slot while it runs (faults/support/fault-slot.ts).
//
// A few files measure how fast Keel answers under a load of their own, with bounds that the files
// beside them move: they run with the machine to themselves (decision 0103). The sequencer plans
// them last, when the other files are done, and each holds the fault slot and the whole machine
// while it runs, a fault file or not.

/** Whether a test file, by its absolute or repository-relative path, is a fault file. */
export function isFaultFile(path: string): boolean {
  return `${sep}${path}`.includes(`${sep}test${sep}faults${sep}`);
}

/**
 * The files that run with no other file beside them, each for a bound of issue 40 that a
 * three-worker CI run failed beside two other files: large-task's /healthz (max under 500 ms while
 * 300 subscribers attach; 562 ms, where alone and beside two busy cores it stays under 150 ms);
 * fair-run-slots' light client (p99 under a flood within 2x its unloaded p99, each the second
 * worst of 100 samples; 309 ms against 2 x 145, after 124-152 ms in ten runs); push isolation's
 * healthy client beside a hung receiver (each delivery within 2 s of being queued; 2.4 s, with the
 * cores saturated, and earlier its other test's bound).
 */
const QUIET_FILES = [
  ['test', 'faults', 'large-task.test.ts'],
  ['test', 'faults', 'fair-run-slots.test.ts'],
  ['test', 'integration', 'push', 'isolation.test.ts'],
];

/** Whether a test file, by its absolute or repository-relative path, runs with the machine to itself. */
export function needsQuietMachine(path: string): boolean {
  return QUIET_FILES.some((parts) => `${sep}${path}`.endsWith(`${sep}${parts.join(sep)}`));
}
