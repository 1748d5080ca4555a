import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { readFileDurations } from '../test/support/suite-sequencer.js';

// bench:suite — what each test file costs the machine: its files run one at a time, each in a
// vitest run of its own (`vitest run --project <project> <file>`), and for each the wall time and
// the CPU the whole machine spent meanwhile (user, nice, system, irq and softirq time from
// /proc/stat: the file's vitest process, the Keel processes and CLI commands it starts, the
// Postgres sessions and private clusters it uses). Prints figures; asserts nothing.
//
// CI runs two files at a time on two cores and is bound by CPU, so a file's CPU-seconds, not its
// wall time, are what it adds to CI (decision 0094). The machine must be quiet: any other process's
// CPU is counted too (the load average is printed before each file).
//
// Arguments: `project:file` pairs (`redis:test/faults/worker-kill.test.ts`), or none for the
// BENCH_SUITE_TOP (20) files longest in test/support/file-durations.json, each in its project.
// BENCH_JSON=<path> writes the rows as JSON as well.

type Row = { project: string; file: string; wallSeconds: number; cpuSeconds: number; exitCode: number | null; load: number };

const root = fileURLToPath(new URL('..', import.meta.url));
const vitest = fileURLToPath(new URL('../node_modules/vitest/vitest.mjs', import.meta.url));
/** /proc/stat's clock ticks (USER_HZ), 100 on Linux. */
const TICKS_PER_SECOND = 100;

/** The machine's busy CPU ticks so far: every core's user, nice, system, irq and softirq time. */
function busyTicks(): number {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0] = fields;
  return user + nice + system + irq + softirq;
}

function filesToMeasure(args: readonly string[]): Array<{ project: string; file: string }> {
  if (args.length > 0) {
    return args.map((arg) => {
      const at = arg.indexOf(':');
      if (at <= 0) throw new Error(`"${arg}" is not project:file (for example postgres:test/faults/worker-kill.test.ts)`);
      return { project: arg.slice(0, at), file: arg.slice(at + 1) };
    });
  }
  const top = Number(process.env.BENCH_SUITE_TOP ?? 20);
  if (!Number.isInteger(top) || top < 1) throw new Error(`BENCH_SUITE_TOP must be a positive whole number, not "${process.env.BENCH_SUITE_TOP}"`);
  return Object.entries(readFileDurations())
    .flatMap(([project, files]) => Object.entries(files ?? {}).map(([file, seconds]) => ({ project, file, seconds })))
    .sort((a, b) => b.seconds - a.seconds)
    .slice(0, top)
    .map(({ project, file }) => ({ project, file }));
}

function measure(project: string, file: string): Row {
  const load = loadavg()[0]!;
  const ticksBefore = busyTicks();
  const started = performance.now();
  const run = spawnSync(process.execPath, [vitest, 'run', '--project', project, file], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 256 * 1024 * 1024 });
  const wallSeconds = (performance.now() - started) / 1000;
  const cpuSeconds = (busyTicks() - ticksBefore) / TICKS_PER_SECOND;
  if (run.status !== 0) process.stderr.write(`${project} ${file} exited ${run.status ?? run.signal}:\n${String(run.stdout).split('\n').slice(-30).join('\n')}\n`);
  return { project, file, wallSeconds, cpuSeconds, exitCode: run.status, load };
}

let targets: Array<{ project: string; file: string }>;
try {
  targets = filesToMeasure(process.argv.slice(2));
} catch (error) {
  console.error(`bench:suite: ${(error as Error).message}`);
  process.exit(2);
}
console.log(`bench:suite: ${targets.length} files one at a time on ${cpus().length} cores; wall and machine CPU seconds per file`);
console.log('project\tfile\twall s\tCPU s\tcores busy\tload before\texit');
const rows: Row[] = [];
for (const { project, file } of targets) {
  const row = measure(project, file);
  rows.push(row);
  console.log(`${project}\t${file}\t${row.wallSeconds.toFixed(1)}\t${row.cpuSeconds.toFixed(1)}\t${(row.cpuSeconds / row.wallSeconds).toFixed(2)}\t${row.load.toFixed(1)}\t${row.exitCode}`);
}
const sum = (pick: (row: Row) => number) => rows.reduce((total, row) => total + pick(row), 0);
console.log(`all ${rows.length} files: ${sum((row) => row.wallSeconds).toFixed(0)} s wall, ${sum((row) => row.cpuSeconds).toFixed(0)} CPU-s`);
if (process.env.BENCH_JSON) {
  writeFileSync(process.env.BENCH_JSON, `${JSON.stringify({ at: new Date().toISOString(), cores: cpus().length, rows }, null, 2)}\n`);
}
if (rows.some((row) => row.exitCode !== 0)) process.exitCode = 1;
