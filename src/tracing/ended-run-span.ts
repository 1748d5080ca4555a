import { recordRunSpan, type SettledRun } from './run-trace.js';
import { tracingEnabled } from './tracing-switch.js';

// A run that ends where no worker holds it has no stretch to record its `invoke_agent` span at the
// settle (run-trace.ts): a cancel of a queued or waiting run, the reaper's dead letter, an
// approval that timed out. Each records the span where the run ended, so every run of a traced
// task has its span, from its creation to its end, under the request that created it.

/** How a run ended outside a worker. */
export type EndedOutsideWorker = 'cancelled' | 'dead_lettered' | 'approval_timed_out';

/** Records the `invoke_agent` span of a run that ended outside a worker (nothing while tracing is off). */
export function recordRunEndedOutsideWorker(run: SettledRun, ending: EndedOutsideWorker): void {
  if (!tracingEnabled()) return;
  try {
    recordRunSpan(run, ending === 'cancelled' ? { status: 'cancelled', failed: false } : { status: 'failed', failed: true });
  } catch {
    // Called right after the run's end was committed: a span that cannot be recorded must not
    // turn that committed end into a failed cancel, reap or sweep.
  }
}
