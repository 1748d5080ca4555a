import { getPriority, setPriority } from 'node:os';

// The fault files' CPU priority (decision 0102): a fault file runs at FAULT_FILE_NICE while it
// holds the fault slot (test/faults/support/fault-slot.ts), the files beside it at 0, so the
// suite can run a third worker without slowing the fault files.

/** The fault file's nice value while it holds the slot (the other files run at 0). */
export const FAULT_FILE_NICE = -5;

/**
 * Whether this process may raise a priority (root with CAP_SYS_NICE): tried on this thread and
 * set back at once. Without it the suite runs two workers, its fault files at the others' priority.
 */
export function canRaisePriority(): boolean {
  const before = getPriority();
  try {
    setPriority(before - 1);
  } catch {
    return false;
  }
  setPriority(before);
  return true;
}
