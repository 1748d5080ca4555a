import { agentLoopMachine, freshLoopState, type GuardedStages, type LoopContext } from '../machines/agent-loop.machine.js';
import { createMachineStepper, type MachineSteps, type StepEngine } from '../machines/step-machine.js';
import { fmt, percentile } from './support.js';

// bench:loop — the CPU cost of stepping the agent loop alone: echo runs whose steps answer at
// once, through the flat engine and through XState's own transition (decision 0032), rounds
// alternating in one process so both see the same machine. Prints µs per run (median of the
// rounds, and the range) for an agent without guardrails and one with both stages guarded.
// Knobs: BENCH_LOOP_RUNS (runs per round, default 20000), BENCH_LOOP_ROUNDS (default 6).

const runsPerRound = Number(process.env.BENCH_LOOP_RUNS ?? 20_000);
const rounds = Number(process.env.BENCH_LOOP_ROUNDS ?? 6);

const steps: MachineSteps<typeof agentLoopMachine> = {
  checkpoint: async () => ({ alive: true }),
  checkGuardrails: async () => ({ verdict: 'allow' }),
  callModel: async () => ({ kind: 'reply', text: 'echo: hello', toolCalls: [], approvalRequired: false, providerIndex: 0, inputTokens: 2, outputTokens: 3 }),
  runTools: async () => ({ kind: 'done', messages: [] }),
};

const inputOf = (guarded: GuardedStages): LoopContext => ({
  ...freshLoopState([{ role: 'user', content: 'hello' }]),
  limits: { maxIterations: 8, tokenBudget: null },
  guarded,
  outcome: null,
});

async function round(engine: StepEngine, guarded: GuardedStages): Promise<number> {
  const stepper = createMachineStepper(agentLoopMachine, { engine });
  const started = process.hrtime.bigint();
  for (let index = 0; index < runsPerRound; index += 1) {
    const run = await stepper.run(inputOf(guarded), steps);
    if (run.output.kind !== 'complete') throw new Error(`an echo run ended ${run.output.kind}`);
  }
  return Number(process.hrtime.bigint() - started) / runsPerRound / 1000;
}

const cases: { name: string; guarded: GuardedStages }[] = [
  { name: 'no guardrails', guarded: { input: false, answer: false } },
  { name: 'both stages guarded', guarded: { input: true, answer: true } },
];
const engines: StepEngine[] = ['flat', 'xstate'];

console.log(`bench:loop: ${rounds} rounds of ${runsPerRound} echo runs per engine and case, alternating (the first round of each is warm-up)`);
for (const { name, guarded } of cases) {
  const timings = new Map<StepEngine, number[]>(engines.map((engine) => [engine, []]));
  for (let index = 0; index <= rounds; index += 1) {
    for (const engine of engines) {
      const micros = await round(engine, guarded);
      if (index > 0) timings.get(engine)!.push(micros);
    }
  }
  const medians = new Map(engines.map((engine) => [engine, percentile([...timings.get(engine)!].sort((a, b) => a - b), 50)]));
  for (const engine of engines) {
    const sorted = [...timings.get(engine)!].sort((a, b) => a - b);
    console.log(`  ${name.padEnd(20)} ${engine.padEnd(7)} ${fmt(medians.get(engine)!).padStart(7)} µs/run (rounds ${fmt(sorted[0]!)}–${fmt(sorted[sorted.length - 1]!)})`);
  }
  console.log(`  ${name.padEnd(20)} xstate ÷ flat: ${fmt(medians.get('xstate')! / medians.get('flat')!, 2)}×`);
}
