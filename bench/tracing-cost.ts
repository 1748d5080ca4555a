import { randomUUID } from 'node:crypto';
import { AsyncLocalStorage } from 'node:async_hooks';
import { fileURLToPath } from 'node:url';
import { PerformanceObserver } from 'node:perf_hooks';
import type { SpanExporter } from '@opentelemetry/sdk-trace-base';
import { configSchema } from '../src/config/config-schema.js';
import { GroupCommit } from '../src/db/group-commit.js';
import { inA2AServerSpan, noteTaskId } from '../src/tracing/a2a-server-span.js';
import { inModelCallSpan } from '../src/tracing/gen-ai-spans.js';
import { inRunStretch, newRunLink, newRunTrace, type RunTrace } from '../src/tracing/run-trace.js';
import { tracingEnabled } from '../src/tracing/tracing-switch.js';
import { clockTicks, envKnobs, ManagedChild, machineLine, procStat, runBench, startOtlpSink, writeBenchJson } from './keel-harness.js';
import { fmt, percentile } from './support.js';

// bench:tracing — the CPU that tracing adds to a task in Keel's process, apart from the machine.
// bench:a2a's BENCH_TRACING measures it with Postgres and Redis, whose speed drifts on a shared
// virtual machine by as much as tracing costs; here each task is only what Keel's tracing code
// sees of a blocking SendMessage, so the arms differ by tracing alone:
//   the A2A request's SERVER span (src/tracing/a2a-server-span.ts) around the intake, the run's
//   trace created under it, the creation written by a group commit (src/db/group-commit.ts, its
//   batch span linked to each run), the task noted on the request span; then the worker's stretch
//   span with a model call span inside, the completion's group commit and the run's invoke_agent
//   span (src/tracing/run-trace.ts). Between them the task awaits BENCH_TRACING_AWAITS times
//   (Keel makes about 100 promises a task), with no I/O: the AsyncLocalStorage hooks run on each.
// Tasks start at a fixed rate (BENCH_TRACING_RATE a second, about bench:a2a's), so that batches
// fill and the span processor exports as in Keel, and each arm runs in a process of its own,
// the arms' order rotating round by round. Per arm: CPU per task (user + system, every thread
// of the process, over the measured tasks), the main thread's part, V8's GC pauses, and what
// the arm adds over `off`.
// Arms (BENCH_TRACING_ARMS):
//   off      no SDK wired: Keel's default (every instrumented place reads one flag)
//   hooks    no SDK, an AsyncLocalStorage entered once: its promise hooks alone
//   unsampled  the SDK as Keel wires it with parentbased_always_off: every span site's work, the
//            contexts and the run's trace columns, no span recorded (what a trace a sampler
//            drops still costs)
//   record   the SDK as Keel wires it, every trace recorded, into an exporter that drops each
//            batch unencoded: spans, contexts, the batch processor
//   sdk      the SDK as Keel wires it, exporting every trace over OTLP/HTTP protobuf to a sink
//            process that discards (bench:a2a's sdk arm)
//   sampled  the same with parentbased_traceidratio at BENCH_TRACING_RATIO (0.1)
// Knobs: BENCH_TRACING_TASKS (measured tasks per arm and round, 20000), BENCH_TRACING_WARMUP
// (4000), BENCH_ROUNDS (3), BENCH_JSON.

const ARMS = ['off', 'hooks', 'unsampled', 'record', 'sdk', 'sampled'] as const;
type Arm = (typeof ARMS)[number];
type ArmResult = { arm: Arm; tasks: number; cpuUsPerTask: number; mainUsPerTask: number | null; gcUsPerTask: number; spansPerTask: number | null };

const CHILD_ARM = 'BENCH_TRACING_CHILD_ARM';
const CHILD_SINK = 'BENCH_TRACING_CHILD_SINK';

// ---------------------------------------------------------------------------------------------
// The child: one arm, one round.

/** Counts the spans handed to it and drops them unencoded. */
class DroppingExporter implements SpanExporter {
  spans = 0;
  export(spans: Parameters<SpanExporter['export']>[0], done: Parameters<SpanExporter['export']>[1]): void {
    this.spans += spans.length;
    done({ code: 0 });
  }
  async shutdown(): Promise<void> {}
}

async function wireArm(arm: Arm, sinkOrigin: string | undefined): Promise<DroppingExporter | null> {
  if (arm === 'off') return null;
  if (arm === 'hooks') {
    new AsyncLocalStorage<object>().enterWith({});
    return null;
  }
  const { resolveTelemetry } = await import('../src/telemetry/telemetry-settings.js');
  const { wireTelemetry } = await import('../src/telemetry/telemetry-sdk.js');
  const env: NodeJS.ProcessEnv = { OTEL_EXPORTER_OTLP_ENDPOINT: sinkOrigin ?? 'http://127.0.0.1:9' };
  if (arm === 'sampled') Object.assign(env, { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: process.env.BENCH_TRACING_RATIO ?? '0.1' });
  if (arm === 'unsampled') env.OTEL_TRACES_SAMPLER = 'parentbased_always_off';
  const resolved = resolveTelemetry(configSchema.parse({}).telemetry, env);
  if (!resolved.ok || resolved.settings === null) throw new Error(`bench:tracing: telemetry settings: ${resolved.ok ? 'off' : resolved.problems.join('; ')}`);
  const dropping = arm === 'record' ? new DroppingExporter() : null;
  const wired = wireTelemetry(resolved.settings, { role: 'all', instanceId: 'bench' }, dropping ?? undefined);
  if (!wired.ok) throw new Error(`bench:tracing: ${wired.message}`);
  return dropping;
}

const BATCH_WRITE_MS = 6;

type Creation = { taskId: string; trace: RunTrace | null };

/**
 * The CPU time of the process's main thread (the event loop's; its thread id is the process's), in
 * milliseconds, from Linux's /proc: the rest of the process's time is V8's and libuv's helper
 * threads (GC among them). Null where /proc has no such file.
 */
function mainThreadCpuMs(): number | null {
  const stat = procStat(process.pid, process.pid);
  return stat === null ? null : (stat.ticks * 1000) / clockTicks();
}

async function awaits(count: number): Promise<void> {
  for (let index = 0; index < count; index += 1) await null;
}

function makeTask(perTaskAwaits: number): () => Promise<void> {
  // A batch's write takes a few milliseconds, as Postgres's does in bench:a2a (5-8 ms), so that
  // a batch carries about a dozen tasks there and here.
  const write = async <I>(items: readonly I[]) => {
    await new Promise((resolve) => setTimeout(resolve, BATCH_WRITE_MS));
    return items.map(() => undefined);
  };
  const writeOne = async <I>(item: I) => (await write([item]))[0];
  const creations = new GroupCommit<Creation, undefined>({
    maxBatch: 64,
    writeBatch: write,
    writeOne,
    trace: { name: 'keel.write_batch', linkOf: (creation) => newRunLink(creation.trace, creation.taskId) },
  });
  const completions = new GroupCommit<string, undefined>({ maxBatch: 64, writeBatch: write, writeOne, trace: { name: 'keel.write_batch' } });
  const share = Math.max(1, Math.floor(perTaskAwaits / 4));
  const provider = { name: 'echo', type: 'echo', model: 'echo' };
  const reply = { ok: true as const, reply: { usage: { inputTokens: 3, outputTokens: 5 }, toolCalls: [] } };
  const callModel = async () => {
    await awaits(share);
    return reply;
  };

  return async () => {
    const taskId = randomUUID();
    let trace: RunTrace | null = null;
    await inA2AServerSpan({ binding: 'jsonrpc', method: 'SendMessage', agentId: 'echo', clientId: 'bench', traceparent: undefined, tracestate: undefined }, async () => {
      await awaits(share);
      trace = newRunTrace();
      await creations.submit({ taskId, trace });
      noteTaskId(taskId);
    });
    const stored = trace as RunTrace | null;
    const run = {
      id: randomUUID(),
      agent: 'echo',
      task_id: taskId,
      created_at: Date.now(),
      revision: 2,
      requeue_count: 0,
      trace_context: stored?.context ?? null,
      trace_parent_span: stored?.parentSpanId ?? null,
      trace_state: stored?.state ?? null,
    };
    const stretch = async () => {
      await awaits(share);
      await (tracingEnabled() ? inModelCallSpan(provider, { iteration: 1, attempt: 1 }, callModel) : callModel());
      await completions.submit(run.id);
      await awaits(share);
      return { kind: 'settled', status: 'completed' };
    };
    await (tracingEnabled() ? inRunStretch(run, 'bench-worker', stretch) : stretch());
  };
}

/** Starts `count` tasks at `rate` a second and waits for them all. */
async function paced(task: () => Promise<void>, count: number, rate: number): Promise<void> {
  const running: Promise<void>[] = [];
  const began = performance.now();
  await new Promise<void>((resolve) => {
    const timer = setInterval(() => {
      const due = Math.min(count, Math.floor(((performance.now() - began) / 1000) * rate));
      while (running.length < due) running.push(task());
      if (running.length >= count) {
        clearInterval(timer);
        resolve();
      }
    }, 1);
  });
  await Promise.all(running);
}

async function child(arm: Arm): Promise<void> {
  const knobs = envKnobs('bench:tracing');
  const tasks = knobs.positiveInt('BENCH_TRACING_TASKS', 20_000);
  const warmup = knobs.positiveInt('BENCH_TRACING_WARMUP', 4_000);
  const rate = knobs.positive('BENCH_TRACING_RATE', 2_000);
  const dropping = await wireArm(arm, process.env[CHILD_SINK]);
  const task = makeTask(knobs.positiveInt('BENCH_TRACING_AWAITS', 50));
  await paced(task, warmup, rate);
  let gcMs = 0;
  const observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) gcMs += entry.duration;
  });
  observer.observe({ entryTypes: ['gc'] });
  const spansBefore = dropping?.spans ?? 0;
  const cpuBefore = process.cpuUsage();
  const mainBefore = mainThreadCpuMs();
  await paced(task, tasks, rate);
  const cpu = process.cpuUsage(cpuBefore);
  const mainAfter = mainThreadCpuMs();
  // GC entries are delivered asynchronously: one more turn collects the last of them.
  await new Promise((resolve) => setTimeout(resolve, 50));
  observer.disconnect();
  const result: ArmResult = {
    arm,
    tasks,
    cpuUsPerTask: (cpu.user + cpu.system) / tasks,
    mainUsPerTask: mainBefore !== null && mainAfter !== null ? ((mainAfter - mainBefore) * 1000) / tasks : null,
    gcUsPerTask: (gcMs * 1000) / tasks,
    spansPerTask: dropping ? (dropping.spans - spansBefore) / tasks : null,
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

// ---------------------------------------------------------------------------------------------
// The parent: every arm in a process of its own, round by round.

async function runArm(arm: Arm, sinkOrigin: string | null): Promise<ArmResult> {
  const env: NodeJS.ProcessEnv = { ...process.env, [CHILD_ARM]: arm, ...(sinkOrigin ? { [CHILD_SINK]: sinkOrigin } : {}) };
  const child = new ManagedChild(`bench:tracing ${arm}`, process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url)], { env, captureStdout: true });
  const code = await child.exited;
  const line = child.stdout.split('\n').find((text) => text.startsWith('{'));
  if (code !== 0 || !line) throw new Error(`bench:tracing: the ${arm} arm exited ${code}:\n${child.tail()}`);
  return JSON.parse(line) as ArmResult;
}

async function main(): Promise<number> {
  const knobs = envKnobs('bench:tracing');
  const arms = knobs.choices('BENCH_TRACING_ARMS', ARMS.join(','), ARMS);
  const rounds = knobs.positiveInt('BENCH_ROUNDS', 3);
  const tasks = knobs.positiveInt('BENCH_TRACING_TASKS', 20_000);
  const rate = knobs.positive('BENCH_TRACING_RATE', 2_000);
  console.log(`bench:tracing: ${rounds} rounds; per arm and round ${tasks} tasks at ${rate}/s after a warm-up, each arm in a process of its own, arms rotating`);
  console.log(machineLine('not used'));
  const sink = arms.some((arm) => arm === 'sdk' || arm === 'sampled' || arm === 'unsampled') ? await startOtlpSink() : null;
  const results = new Map<Arm, ArmResult[]>(arms.map((arm) => [arm, []]));
  try {
    for (let round = 0; round < rounds; round += 1) {
      const order = arms.map((_, index) => arms[(index + round) % arms.length]!);
      const line: string[] = [];
      for (const arm of order) {
        const result = await runArm(arm, sink?.origin ?? null);
        results.get(arm)!.push(result);
        line.push(`${arm} ${fmt(result.cpuUsPerTask, 1)}`);
      }
      console.log(`  round ${round + 1}/${rounds}: µs of CPU per task: ${line.join(', ')}`);
    }
  } finally {
    await sink?.child.stop(5_000);
  }
  const median = (values: number[]) => percentile([...values].sort((a, b) => a - b), 50);
  const summary = arms.map((arm) => {
    const runs = results.get(arm)!;
    const cpu = runs.map((run) => run.cpuUsPerTask);
    const spans = runs.map((run) => run.spansPerTask).filter((value): value is number => value !== null);
    const main = runs.map((run) => run.mainUsPerTask).filter((value): value is number => value !== null);
    return {
      arm,
      cpuUsPerTask: median(cpu),
      cpuMin: Math.min(...cpu),
      cpuMax: Math.max(...cpu),
      mainUsPerTask: main.length > 0 ? median(main) : null,
      gcUsPerTask: median(runs.map((run) => run.gcUsPerTask)),
      spansPerTask: spans.length > 0 ? median(spans) : null,
    };
  });
  const off = summary.find((row) => row.arm === 'off') ?? null;
  const over = (value: number | null, base: number | null | undefined) => (value !== null && base !== null && base !== undefined ? `+${fmt(value - base, 1)}` : '');
  console.log('arm       CPU µs/task (range)     over off   main thread µs/task   over off   GC µs/task   spans/task');
  for (const row of summary) {
    const isOff = row.arm === 'off';
    console.log(
      `${row.arm.padEnd(9)} ${fmt(row.cpuUsPerTask, 1).padStart(6)} (${fmt(row.cpuMin, 1)}–${fmt(row.cpuMax, 1)})`.padEnd(33) +
        `${(isOff ? '' : over(row.cpuUsPerTask, off?.cpuUsPerTask)).padStart(8)}   ${(row.mainUsPerTask === null ? '' : fmt(row.mainUsPerTask, 1)).padStart(19)}   ` +
        `${(isOff ? '' : over(row.mainUsPerTask, off?.mainUsPerTask)).padStart(8)}   ${fmt(row.gcUsPerTask, 1).padStart(10)}   ${row.spansPerTask === null ? '' : fmt(row.spansPerTask, 2)}`,
    );
  }
  console.log('CPU µs/task: every thread of the arm\'s process over the measured tasks; main thread: the event loop\'s alone (/proc); GC: V8\'s pauses; medians of the rounds; "over off": what tracing adds to a task');
  writeBenchJson({ bench: 'tracing', date: new Date().toISOString(), node: process.version, rounds, tasks, rate, arms: summary, rounds_: Object.fromEntries(results) });
  return 0;
}

const arm = process.env[CHILD_ARM] as Arm | undefined;
if (arm !== undefined) {
  if (!(ARMS as readonly string[]).includes(arm)) throw new Error(`bench:tracing: unknown arm ${arm}`);
  await child(arm);
  process.exit(0);
} else {
  runBench('bench:tracing', main);
}
