import { sep } from 'node:path';

// What the suite calls a fault file: a file under test/faults/. The sequencer plans them one at a
// time (suite-sequencer.ts), and each holds the fault slot while it runs (faults/support/fault-slot.ts).

/** Whether a test file, by its absolute or repository-relative path, is a fault file. */
export function isFaultFile(path: string): boolean {
  return `${sep}${path}`.includes(`${sep}test${sep}faults${sep}`);
}
