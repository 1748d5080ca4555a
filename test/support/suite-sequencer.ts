import { readFileSync } from 'node:fs';
import { relative, sep } from 'node:path';
import { BaseSequencer, type TestSpecification, type Vitest } from 'vitest/node';
import { isFaultFile, needsQuietMachine } from './fault-files.js';

// The order in which the suite's files are handed to vitest's workers (three when run as root,
// else two: vitest.config.ts; a free worker takes the next file). The fault files are a third of
// the suite's time, and each runs several Keel processes under load: two of them at once slowed
// both by half (the Postgres crash file took 231 s instead of 150 beside another fault file) and
// left their timing-bound steps to chance. So the order is planned by simulating the workers: a
// fault file is handed out only when no other is expected to be running, the other files fill the
// time in between, longest first. With three workers the fault files one after another are the
// run's length (decision 0102), and the plan starts them with the run. One plan holds every project of the run (suite-plan.ts: the suite on Postgres,
// the queue's files on Redis, interop with runs.directWrites), so a fault file of one project
// is not planned beside a fault file of another. The plan orders; it does not hold a file back:
// what keeps a fault file from starting beside one that overran its duration is the fault slot
// each holds (test/faults/support/fault-slot.ts, decision 0101), and a plan close to the real
// durations keeps the workers from waiting for it.
//
// So the plan is only as good as its durations. CI runs a clean clone, where vitest remembers none:
// with one estimate per folder, the 230 s Postgres crash file was planned as 60 s and ran beside
// the next fault file for 78 s (2026-12-02). So each file's duration in the whole suite, per
// project, is kept in test/support/file-durations.json (`npm run test:durations` after a full
// run writes it again from the suite's report, suite-report.ts); a project without durations of
// its own takes those of its queue backend's project, vitest's own memory serves a file not in it
// yet, a folder's estimate one neither knows.

/** Seconds a file of each folder takes, for files no recorded duration knows. */
const EXPECTED_SECONDS: Readonly<Record<string, number>> = { faults: 60, e2e: 20, fuzz: 13, integration: 6, interop: 6, unit: 0.5 };

/** Seconds each file took in a whole run of the suite, per vitest project (suite-plan.ts; repository-relative paths). */
export type FileDurations = Partial<Record<string, Record<string, number>>>;

export const FILE_DURATIONS_PATH = new URL('./file-durations.json', import.meta.url);

/** The recorded durations, or none when the file is missing or unreadable. */
export function readFileDurations(): FileDurations {
  try {
    return JSON.parse(readFileSync(FILE_DURATIONS_PATH, 'utf8')) as FileDurations;
  } catch {
    // Missing or unreadable: vitest's memory and the folder estimates plan the run.
    return {};
  }
}

export class SuiteSequencer extends BaseSequencer {
  private readonly durations: FileDurations;

  constructor(ctx: Vitest, durations: FileDurations = readFileDurations()) {
    super(ctx);
    this.durations = durations;
  }

  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const seconds = new Map(files.map((file) => [file, this.expectedSeconds(file)]));
    // The projects in the order suite-plan.ts lists them, each file longest first: a worker that
    // takes the next file of the project it just ran keeps its process (vitest reuses a worker only
    // within a project), so the plan runs the projects' files mostly one project after the other.
    const rank = new Map(this.ctx.projects.map((project, index) => [project.name, index]));
    const inOrder = (a: TestSpecification, b: TestSpecification) =>
      rank.get(a.project.name)! - rank.get(b.project.name)! || seconds.get(b)! - seconds.get(a)!;
    // A file that needs the machine to itself goes last, once every other file has started: the
    // machine is then the least loaded it will be, and it waits for the others to end (decision 0103).
    const quiet = files.filter((file) => needsQuietMachine(this.relativePath(file))).sort(inOrder);
    const faults = files.filter((file) => isFaultFile(this.relativePath(file)) && !quiet.includes(file)).sort(inOrder);
    const others = files.filter((file) => !faults.includes(file) && !quiet.includes(file)).sort(inOrder);
    const workers = Math.max(1, Number(this.ctx.config.maxWorkers) || 1);
    const freeAt = Array.from({ length: workers }, () => 0);
    let faultEndsAt = 0;
    const order: TestSpecification[] = [];
    while (faults.length > 0 || others.length > 0) {
      const worker = freeAt.indexOf(Math.min(...freeAt));
      const now = freeAt[worker]!;
      const takeFault = faults.length > 0 && (now >= faultEndsAt || others.length === 0);
      const next = takeFault ? faults.shift()! : others.shift()!;
      freeAt[worker] = now + seconds.get(next)!;
      if (takeFault) faultEndsAt = freeAt[worker];
      order.push(next);
    }
    return [...order, ...quiet];
  }

  private relativePath(file: TestSpecification): string {
    return relative(this.ctx.config.root, file.moduleId);
  }

  private expectedSeconds(file: TestSpecification): number {
    const path = this.relativePath(file);
    const key = path.split(sep).join('/');
    const recorded = this.durations[file.project.name]?.[key] ?? this.durations[backendOf(file)]?.[key];
    if (recorded !== undefined) return recorded;
    const last = this.ctx.cache.getFileTestResults(`${file.project.name}:${path}`);
    if (last && last.duration > 0) return last.duration / 1000;
    return EXPECTED_SECONDS[folderOf(path)] ?? 6;
  }
}

/** The queue backend a file's project runs on: its own environment's, else the run's. */
function backendOf(file: TestSpecification): string {
  return file.project.config.env?.KEEL_TEST_QUEUE ?? process.env.KEEL_TEST_QUEUE ?? 'postgres';
}

/** `test/faults/x.test.ts` → `faults`. */
function folderOf(path: string): string {
  return path.split(sep)[1] ?? '';
}
