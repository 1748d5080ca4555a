import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { TestSpecification, Vitest } from 'vitest/node';
import { SuiteSequencer, type FileDurations } from '../../support/suite-sequencer.js';

// The suite's own file order (vitest.config.ts): what two workers that each take the next file
// when free would run, given the recorded durations (test/support/file-durations.json) and those
// vitest remembers.

const ROOT = '/keel';

/** The projects of `npm test` (suite-plan.ts), in their order, each with the queue backend its environment names. */
const PROJECTS = [
  { name: 'postgres', config: { env: { KEEL_TEST_QUEUE: 'postgres' } } },
  { name: 'redis', config: { env: { KEEL_TEST_QUEUE: 'redis' } } },
  { name: 'postgres-direct-writes', config: { env: { KEEL_TEST_QUEUE: 'postgres', KEEL_TEST_DIRECT_WRITES: '1' } } },
];
type ProjectName = 'postgres' | 'redis' | 'postgres-direct-writes';
const project = (name: ProjectName) => PROJECTS.find((entry) => entry.name === name)!;

/** A sequencer whose vitest remembers `durationsMs` (by path, in any project), with `recorded` as the repository's file of durations. */
function sequencer(durationsMs: Record<string, number>, recorded: FileDurations = {}): SuiteSequencer {
  const remembered = (key: string) => key.slice(key.indexOf(':') + 1);
  const ctx = {
    config: { root: ROOT, maxWorkers: 2 },
    projects: PROJECTS,
    cache: { getFileTestResults: (key: string) => (remembered(key) in durationsMs ? { duration: durationsMs[remembered(key)]!, failed: false } : undefined) },
  };
  return new SuiteSequencer(ctx as unknown as Vitest, recorded);
}

const spec = (path: string, name: ProjectName = 'postgres') => ({ moduleId: join(ROOT, path), project: project(name) }) as unknown as TestSpecification;

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
    const files = Object.keys(durations).map((path) => spec(path));
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
    const order = await sequencer({}).sort(paths.map((path) => spec(path)));
    expect(order).toHaveLength(paths.length);
    // Folder estimates: faults 60 s, e2e 20 s, unit 0.5 s. Six e2e files and ten unit files fill
    // the first fault's minute and most of the second's; the third follows the second.
    const schedule = replay(order, (path) => ({ faults: 60, e2e: 20, unit: 0.5 })[path.split('/')[1] as 'faults' | 'e2e' | 'unit']);
    expect(overlappingFaults(schedule)).toEqual([]);
    expect(schedule.filter((entry) => entry.path.includes('/faults/')).map((entry) => entry.start)).toEqual([0, 60, 120]);
  });

  it('plans with the recorded durations of its project (or its backend) first, then what vitest remembers, then the folder estimates', async () => {
    // A clean clone: vitest remembers nothing. The recorded crash file is long; planned as a
    // folder's 60 s it would start the second fault file while it still runs.
    const recorded: FileDurations = {
      postgres: { 'test/faults/crash.test.ts': 230, 'test/faults/kill.test.ts': 60, 'test/faults/skipped.test.ts': 0, ...Object.fromEntries(Array.from({ length: 12 }, (_, index) => [`test/integration/i${index}.test.ts`, 20])) },
      redis: { 'test/faults/crash.test.ts': 60, 'test/faults/kill.test.ts': 230 },
    };
    const paths = [...Object.keys(recorded.postgres!), 'test/integration/new.test.ts', 'test/e2e/unknown.test.ts'];
    const actual: Record<string, number> = { ...recorded.postgres!, 'test/integration/new.test.ts': 45, 'test/e2e/unknown.test.ts': 20 };
    const order = await sequencer({ 'test/integration/new.test.ts': 45_000, 'test/faults/crash.test.ts': 30_000 }, recorded).sort(paths.map((path) => spec(path)));
    expect(order).toHaveLength(paths.length);
    const schedule = replay(order, (path) => actual[path]!);
    expect(overlappingFaults(schedule)).toEqual([]);
    expect(order[0]!.moduleId, 'the recorded 230 s, not the remembered 30 s').toBe(join(ROOT, 'test/faults/crash.test.ts'));
    // The file only vitest remembers (45 s) comes before the recorded 20 s files.
    const others = order.map((file) => file.moduleId.slice(ROOT.length + 1)).filter((path) => !path.includes('/faults/'));
    expect(others[0]).toBe('test/integration/new.test.ts');
    // The same files with the folder estimates only: the two long fault files run at once.
    const unplanned = replay(await sequencer({}).sort(paths.map((path) => spec(path))), (path) => actual[path]!);
    expect(overlappingFaults(unplanned)).not.toEqual([]);
    // The Redis project is planned with the Redis durations: there the other fault file is the long one.
    const redisOrder = await sequencer({}, recorded).sort(paths.map((path) => spec(path, 'redis')));
    expect(redisOrder[0]!.moduleId).toBe(join(ROOT, 'test/faults/kill.test.ts'));
    // A project without durations of its own takes its backend's: the direct-writes project runs on Postgres.
    const directOrder = await sequencer({}, recorded).sort(paths.map((path) => spec(path, 'postgres-direct-writes')));
    expect(directOrder[0]!.moduleId).toBe(join(ROOT, 'test/faults/crash.test.ts'));
  });

  it('the three projects of one run: one fault file at a time across all of them, each project\'s files after the one before', async () => {
    const recorded: FileDurations = {
      postgres: { 'test/faults/crash.test.ts': 90, 'test/faults/kill.test.ts': 30, ...Object.fromEntries(Array.from({ length: 10 }, (_, index) => [`test/integration/p${index}.test.ts`, 15])) },
      redis: { 'test/faults/crash.test.ts': 50, ...Object.fromEntries(Array.from({ length: 4 }, (_, index) => [`test/integration/p${index}.test.ts`, 10])) },
      'postgres-direct-writes': { 'test/faults/kill.test.ts': 25, 'test/interop/tasks.test.ts': 6 },
    };
    const files = Object.entries(recorded).flatMap(([name, durations]) => Object.keys(durations!).map((path) => spec(path, name as ProjectName)));
    const order = await sequencer({}, recorded).sort(files);
    expect(new Set(order)).toEqual(new Set(files));
    const seconds = new Map(files.map((file) => [file, recorded[file.project.name]![file.moduleId.slice(ROOT.length + 1)]!]));
    const freeAt = [0, 0];
    const schedule = order.map((file) => {
      const worker = freeAt.indexOf(Math.min(...freeAt));
      const start = freeAt[worker]!;
      freeAt[worker] = start + seconds.get(file)!;
      return { file, start, end: freeAt[worker] };
    });
    const faults = schedule.filter((entry) => entry.file.moduleId.includes('/faults/'));
    expect(faults.flatMap((a) => faults.filter((b) => b !== a && b.start < a.end && a.start < b.end))).toEqual([]);
    // The fault files and the others each go project by project, longest first within one.
    const names = (entries: typeof schedule) => entries.map((entry) => `${entry.file.project.name} ${entry.file.moduleId.slice(ROOT.length + 1)}`);
    expect(names(faults)).toEqual(['postgres test/faults/crash.test.ts', 'postgres test/faults/kill.test.ts', 'redis test/faults/crash.test.ts', 'postgres-direct-writes test/faults/kill.test.ts']);
    const others = schedule.filter((entry) => !faults.includes(entry));
    expect(others.map((entry) => entry.file.project.name)).toEqual([...Array(10).fill('postgres'), ...Array(4).fill('redis'), 'postgres-direct-writes']);
    // Two workers kept busy: the run ends when the work would on two, not after a chain of waits.
    expect(Math.max(...freeAt)).toBeLessThanOrEqual(Math.ceil([...seconds.values()].reduce((sum, value) => sum + value, 0) / 2) + 25);
  });

  it('the files that need the machine to themselves (large-task, fair-run-slots, push isolation) are handed out last, after every other file of every project', async () => {
    const recorded: FileDurations = {
      postgres: { 'test/faults/large-task.test.ts': 16, 'test/faults/fair-run-slots.test.ts': 38, 'test/integration/push/isolation.test.ts': 32, 'test/faults/crash.test.ts': 90, ...Object.fromEntries(Array.from({ length: 8 }, (_, index) => [`test/integration/p${index}.test.ts`, 15])) },
      redis: { 'test/faults/fair-run-slots.test.ts': 36, 'test/faults/crash.test.ts': 50, 'test/integration/p0.test.ts': 10 },
    };
    const files = Object.entries(recorded).flatMap(([name, durations]) => Object.keys(durations!).map((path) => spec(path, name as ProjectName)));
    const order = await sequencer({}, recorded).sort(files);
    expect(new Set(order)).toEqual(new Set(files));
    expect(order.slice(-4).map((file) => `${file.project.name} ${file.moduleId.slice(ROOT.length + 1)}`)).toEqual([
      'postgres test/faults/fair-run-slots.test.ts',
      'postgres test/integration/push/isolation.test.ts',
      'postgres test/faults/large-task.test.ts',
      'redis test/faults/fair-run-slots.test.ts',
    ]);
    // The longest fault file still starts the run.
    expect(order[0]!.moduleId).toBe(join(ROOT, 'test/faults/crash.test.ts'));
  });
});
