import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { TestSpecification, Vitest } from 'vitest/node';
import { SuiteSequencer, type FileDurations } from '../../support/suite-sequencer.js';

// The suite's own file order (vitest.config.ts): what two workers that each take the next file
// when free would run, given the recorded durations (test/support/file-durations.json) and those
// vitest remembers.

const ROOT = '/keel';

/** A sequencer whose vitest remembers `durationsMs`, with `recorded` as the repository's file of durations. */
function sequencer(durationsMs: Record<string, number>, recorded: FileDurations = {}, backend: 'postgres' | 'redis' = 'postgres'): SuiteSequencer {
  const ctx = {
    config: { root: ROOT, maxWorkers: 2 },
    cache: { getFileTestResults: (key: string) => (key.slice(1) in durationsMs ? { duration: durationsMs[key.slice(1)]!, failed: false } : undefined) },
  };
  return new SuiteSequencer(ctx as unknown as Vitest, recorded, backend);
}

const spec = (path: string) => ({ moduleId: join(ROOT, path), project: { name: '' } }) as unknown as TestSpecification;

/** Replays the order on two workers: each file's start and end, in seconds. */
function replay(order: TestSpecification[], seconds: (path: string) => number) {
  const freeAt = [0, 0];
  return order.map((file) => {
    const path = file.moduleId.slice(ROOT.length + 1);
    const worker = freeAt.indexOf(Math.min(...freeAt));
    const start = freeAt[worker]!;
    freeAt[worker] = start + seconds(path);
    return { path, start, end: freeAt[worker] };
  });
}

const overlappingFaults = (schedule: ReturnType<typeof replay>) =>
  schedule.filter((a) => a.path.startsWith('test/faults/')).flatMap((a) =>
    schedule.filter((b) => b !== a && b.path.startsWith('test/faults/') && b.start < a.end && a.start < b.end).map((b) => [a.path, b.path]),
  );

describe('SuiteSequencer', () => {
  it('with the durations of the last run: every file once, fault files never at the same time, the rest longest first between them', async () => {
    const durations: Record<string, number> = {
      'test/faults/postgres-crash.test.ts': 150_000,
      'test/faults/worker-kill.test.ts': 70_000,
      'test/faults/pool-crash.test.ts': 17_000,
      'test/e2e/cli-runs.test.ts': 42_000,
      'test/e2e/cli-cards.test.ts': 37_000,
      'test/integration/push/deadline.test.ts': 24_000,
      'test/interop/tasks.test.ts': 11_000,
      'test/unit/privacy/redact.test.ts': 300,
      // Enough other files to fill the 237 s of fault files beside them.
      ...Object.fromEntries(Array.from({ length: 20 }, (_, index) => [`test/integration/i${index}.test.ts`, 12_000 + index])),
    };
    const files = Object.keys(durations).map(spec);
    const order = await sequencer(durations).sort(files);
    expect(new Set(order)).toEqual(new Set(files));
    const schedule = replay(order, (path) => durations[path]! / 1000);
    expect(overlappingFaults(schedule)).toEqual([]);
    const others = order.map((file) => file.moduleId).filter((path) => !path.includes('/faults/'));
    expect(others).toEqual([...others].sort((a, b) => durations[b.slice(ROOT.length + 1)]! - durations[a.slice(ROOT.length + 1)]!));
    expect(order[0]!.moduleId).toBe(join(ROOT, 'test/faults/postgres-crash.test.ts'));
  });

  it('on a clean clone (no durations): fault files apart by their folder estimates, and the last ones after the others run out', async () => {
    const paths = [
      ...['a', 'b', 'c'].map((name) => `test/faults/${name}.test.ts`),
      ...Array.from({ length: 6 }, (_, index) => `test/e2e/e${index}.test.ts`),
      ...Array.from({ length: 10 }, (_, index) => `test/unit/u${index}.test.ts`),
    ];
    const order = await sequencer({}).sort(paths.map(spec));
    expect(order).toHaveLength(paths.length);
    // Folder estimates: faults 60 s, e2e 20 s, unit 0.5 s. Six e2e files and ten unit files fill
    // the first fault's minute and most of the second's; the third follows the second.
    const schedule = replay(order, (path) => ({ faults: 60, e2e: 20, unit: 0.5 })[path.split('/')[1] as 'faults' | 'e2e' | 'unit']);
    expect(overlappingFaults(schedule)).toEqual([]);
    expect(schedule.filter((entry) => entry.path.includes('/faults/')).map((entry) => entry.start)).toEqual([0, 60, 120]);
  });

  it('plans with the recorded durations of its backend first, then what vitest remembers, then the folder estimates', async () => {
    // A clean clone: vitest remembers nothing. The recorded crash file is long; planned as a
    // folder's 60 s it would start the second fault file while it still runs.
    const recorded: FileDurations = {
      postgres: { 'test/faults/crash.test.ts': 230, 'test/faults/kill.test.ts': 60, 'test/faults/skipped.test.ts': 0, ...Object.fromEntries(Array.from({ length: 12 }, (_, index) => [`test/integration/i${index}.test.ts`, 20])) },
      redis: { 'test/faults/crash.test.ts': 60, 'test/faults/kill.test.ts': 230 },
    };
    const paths = [...Object.keys(recorded.postgres!), 'test/integration/new.test.ts', 'test/e2e/unknown.test.ts'];
    const actual: Record<string, number> = { ...recorded.postgres!, 'test/integration/new.test.ts': 45, 'test/e2e/unknown.test.ts': 20 };
    const order = await sequencer({ 'test/integration/new.test.ts': 45_000, 'test/faults/crash.test.ts': 30_000 }, recorded).sort(paths.map(spec));
    expect(order).toHaveLength(paths.length);
    const schedule = replay(order, (path) => actual[path]!);
    expect(overlappingFaults(schedule)).toEqual([]);
    expect(order[0]!.moduleId, 'the recorded 230 s, not the remembered 30 s').toBe(join(ROOT, 'test/faults/crash.test.ts'));
    // The file only vitest remembers (45 s) comes before the recorded 20 s files.
    const others = order.map((file) => file.moduleId.slice(ROOT.length + 1)).filter((path) => !path.includes('/faults/'));
    expect(others[0]).toBe('test/integration/new.test.ts');
    // The same files with the folder estimates only: the two long fault files run at once.
    const unplanned = replay(await sequencer({}).sort(paths.map(spec)), (path) => actual[path]!);
    expect(overlappingFaults(unplanned)).not.toEqual([]);
    // A Redis run is planned with the Redis durations: there the other fault file is the long one.
    const redisOrder = await sequencer({}, recorded, 'redis').sort(paths.map(spec));
    expect(redisOrder[0]!.moduleId).toBe(join(ROOT, 'test/faults/kill.test.ts'));
  });
});
