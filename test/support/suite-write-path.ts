// The write path the suite runs Keel with: the default (fast path and group commit), or, with
// KEEL_TEST_DIRECT_WRITES=1 in the test run's environment, `runs.directWrites` (both off: every
// creation and completion written alone, every run through the queue). CI runs the interop and
// fault files once that way (.ci/run). A test that sets runs.directWrites or runs.fastPath itself
// keeps its own value: this goes in before its overrides.

export const SUITE_WRITE_PATH_ENV: Record<string, string> = process.env.KEEL_TEST_DIRECT_WRITES === '1' ? { KEEL_RUNS_DIRECT_WRITES: 'true' } : {};
