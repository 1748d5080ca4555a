import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { and, assign, createActor, fromPromise, sendTo, setup, toPromise, type AnyStateMachine, type StateValue } from 'xstate';
import {
  agentLoopMachine,
  ALL_STAGES_GUARDED,
  freshLoopState,
  type CheckpointResult,
  type GuardrailOutcome,
  type LoopContext,
  type ModelStepResult,
  type ToolStepResult,
} from '../../../machines/agent-loop.machine.js';
import { createMachineStepper, type MachineSteps } from '../../../machines/step-machine.js';
import type { ToolCall, TranscriptMessage } from '../../../src/providers/provider.js';

// The stepper (pure transitions, no actor per run) must be the same law as the actor path the
// run executor used before: for the same scripted step outcomes, the same states in the same
// order, the same calls with the same inputs, and the same final context and output (or the same
// error).

type Src = 'checkpoint' | 'checkGuardrails' | 'callModel' | 'runTools';
type Scripted<T> = { ok: T } | { throws: string };
type Script = {
  checkpoint: Scripted<CheckpointResult>[];
  checkGuardrails: Scripted<GuardrailOutcome>[];
  callModel: Scripted<ModelStepResult>[];
  runTools: Scripted<ToolStepResult>[];
};

/** When a script runs out, the loop gets the outcome that ends a run soonest. */
const DEFAULTS: { [K in Src]: Script[K][number] } = {
  checkpoint: { ok: { alive: true } },
  checkGuardrails: { ok: { verdict: 'allow' } },
  callModel: { ok: { kind: 'reply', text: 'the answer', toolCalls: [], approvalRequired: false, providerIndex: 0, inputTokens: 3, outputTokens: 5 } },
  runTools: { ok: { kind: 'done', messages: [] } },
};

type Call = { src: Src; input: unknown };
type Trace = { values: StateValue[]; calls: Call[]; result: { output: unknown; context: LoopContext } | { error: string } };

/** The step functions of one run of a script; every call and its input is recorded. */
function scriptedSteps(script: Script, calls: Call[]): MachineSteps<typeof agentLoopMachine> {
  const cursor: Record<Src, number> = { checkpoint: 0, checkGuardrails: 0, callModel: 0, runTools: 0 };
  const next = async <K extends Src>(src: K, input: unknown) => {
    calls.push({ src, input: structuredClone(input) });
    const entry = (script[src][cursor[src]++] ?? DEFAULTS[src]) as Scripted<unknown>;
    await Promise.resolve();
    if ('throws' in entry) throw new Error(entry.throws);
    return structuredClone(entry.ok);
  };
  return {
    checkpoint: (input) => next('checkpoint', input) as Promise<CheckpointResult>,
    checkGuardrails: (input) => next('checkGuardrails', input) as Promise<GuardrailOutcome>,
    callModel: (input) => next('callModel', input) as Promise<ModelStepResult>,
    runTools: (input) => next('runTools', input) as Promise<ToolStepResult>,
  };
}

/** The actor path as the run executor had it: the machine provided with promise actors, run by an actor. */
async function throughActor(input: LoopContext, script: Script): Promise<Trace> {
  const calls: Call[] = [];
  const steps = scriptedSteps(script, calls);
  const machine = agentLoopMachine.provide({
    actors: {
      checkpoint: fromPromise(({ input: stepInput }: { input: { context: LoopContext } }) => steps.checkpoint(stepInput, { signal: new AbortController().signal })),
      checkGuardrails: fromPromise(({ input: stepInput }: { input: { stage: 'input' | 'answer'; text: string } }) => steps.checkGuardrails(stepInput, { signal: new AbortController().signal })),
      callModel: fromPromise(({ input: stepInput }: { input: { context: LoopContext } }) => steps.callModel(stepInput, { signal: new AbortController().signal })),
      runTools: fromPromise(({ input: stepInput }: { input: { context: LoopContext; calls: ToolCall[] } }) => steps.runTools(stepInput, { signal: new AbortController().signal })),
    },
  });
  const values: StateValue[] = [];
  const actor = createActor(machine, { input: structuredClone(input) });
  actor.subscribe({ next: (snapshot) => values.push(snapshot.value), error: () => undefined });
  actor.start();
  try {
    const output = await toPromise(actor);
    return { values, calls, result: { output, context: actor.getSnapshot().context } };
  } catch (error) {
    return { values, calls, result: { error: (error as Error).message } };
  }
}

const stepper = createMachineStepper(agentLoopMachine);

async function throughStepper(input: LoopContext, script: Script): Promise<Trace> {
  const calls: Call[] = [];
  const values: StateValue[] = [];
  try {
    const run = await stepper.run(structuredClone(input), scriptedSteps(script, calls), { onSnapshot: (snapshot) => values.push(snapshot.value) });
    expect(run.value).toEqual(values[values.length - 1]);
    return { values, calls, result: { output: run.output, context: run.context } };
  } catch (error) {
    return { values, calls, result: { error: (error as Error).message } };
  }
}

function loopInput(overrides: Partial<LoopContext> = {}): LoopContext {
  return {
    ...freshLoopState([{ role: 'user', content: 'hello' }]),
    limits: { maxIterations: 4, tokenBudget: null },
    guarded: ALL_STAGES_GUARDED,
    outcome: null,
    ...overrides,
  };
}

const script = (parts: Partial<Script>): Script => ({ checkpoint: [], checkGuardrails: [], callModel: [], runTools: [], ...parts });

// ---- arbitraries ----

const text = fc.string({ maxLength: 12 });
const why = fc.constantFrom('lease_lost' as const, 'cancelled' as const);
const toolCall: fc.Arbitrary<ToolCall> = fc.record({ id: fc.constantFrom('c1', 'c2', 'c3'), name: fc.constantFrom('lookup', 'write'), arguments: fc.dictionary(fc.constantFrom('q', 'n'), text, { maxKeys: 1 }) });
const toolMessage: fc.Arbitrary<TranscriptMessage> = fc.record({ role: fc.constant('tool' as const), toolCallId: fc.constantFrom('c1', 'c2'), name: fc.constant('lookup'), content: text });
const stepError = fc.record({ throws: fc.constantFrom('step failed', 'connection lost') });
const scripted = <T>(ok: fc.Arbitrary<T>, weight = 12): fc.Arbitrary<Scripted<T>> =>
  fc.oneof({ arbitrary: fc.record({ ok }), weight }, { arbitrary: stepError, weight: 1 });

const checkpointOutcome = scripted<CheckpointResult>(
  fc.oneof({ arbitrary: fc.constant({ alive: true as const }), weight: 8 }, { arbitrary: fc.record({ alive: fc.constant(false as const), why }), weight: 1 }),
);
const guardrailOutcome = scripted<GuardrailOutcome>(
  fc.oneof(
    { arbitrary: fc.constant({ verdict: 'allow' as const }), weight: 6 },
    { arbitrary: fc.record({ verdict: fc.constant('deny' as const), guardrail: fc.constantFrom('pii', 'tone'), reason: text }), weight: 1 },
    { arbitrary: fc.record({ verdict: fc.constant('requireApproval' as const), guardrail: fc.constantFrom('pii', 'tone'), reason: text }), weight: 1 },
  ),
);
const replyOutcome = fc.oneof(
  { arbitrary: fc.constant(undefined), weight: 6 },
  { arbitrary: fc.record({ kind: fc.constant('reject' as const), reason: text }), weight: 1 },
  { arbitrary: fc.record({ kind: fc.constant('input_required' as const), prompt: text }), weight: 1 },
  { arbitrary: fc.record({ kind: fc.constant('status_message' as const), text }), weight: 1 },
  { arbitrary: fc.record({ kind: fc.constant('direct_message' as const), text }), weight: 1 },
);
const modelOutcome = scripted<ModelStepResult>(
  fc.oneof(
    {
      arbitrary: fc
        .record({
          text: fc.option(text, { nil: null }),
          toolCalls: fc.array(toolCall, { maxLength: 2 }),
          approvalRequired: fc.boolean(),
          providerIndex: fc.nat(2),
          inputTokens: fc.nat(40),
          outputTokens: fc.nat(40),
          outcome: replyOutcome,
        })
        .map(({ outcome, ...reply }) => ({ kind: 'reply' as const, ...reply, ...(outcome ? { outcome } : {}) })),
      weight: 8,
    },
    {
      arbitrary: fc.record({
        kind: fc.constant('failed' as const),
        reason: fc.constantFrom('provider_failed' as const, 'not_retryable' as const, 'result_not_retainable' as const),
        errorClass: fc.constantFrom('timeout', 'http_500'),
        detail: fc.constant({ attempts: 2 }),
      }),
      weight: 1,
    },
    { arbitrary: fc.record({ kind: fc.constant('stop' as const), why }), weight: 1 },
  ),
);
const pendingInput = fc.record({ toolCallId: fc.constantFrom('', 'c1'), toolName: fc.constantFrom('', 'ask'), prompt: text, schema: fc.constant({}) });
const toolOutcome = scripted<ToolStepResult>(
  fc.oneof(
    { arbitrary: fc.record({ kind: fc.constant('done' as const), messages: fc.array(toolMessage, { maxLength: 2 }) }), weight: 6 },
    { arbitrary: fc.record({ kind: fc.constant('input_required' as const), messages: fc.array(toolMessage, { maxLength: 1 }), pending: pendingInput }), weight: 1 },
    {
      arbitrary: fc.record({
        kind: fc.constant('dependency' as const),
        messages: fc.array(toolMessage, { maxLength: 1 }),
        pending: fc.record({ toolCallId: fc.constant('c1'), toolName: fc.constant('remote_agent'), dependencyId: fc.uuid() }),
      }),
      weight: 1,
    },
    { arbitrary: fc.record({ kind: fc.constant('stop' as const), why }), weight: 1 },
  ),
);
const scriptArbitrary: fc.Arbitrary<Script> = fc.record({
  checkpoint: fc.array(checkpointOutcome, { maxLength: 6 }),
  checkGuardrails: fc.array(guardrailOutcome, { maxLength: 4 }),
  callModel: fc.array(modelOutcome, { maxLength: 5 }),
  runTools: fc.array(toolOutcome, { maxLength: 4 }),
});

/** Where a run starts: a fresh request, or a resumption of each kind the executor rebuilds. */
const startArbitrary: fc.Arbitrary<LoopContext> = fc
  .record({
    limits: fc.record({ maxIterations: fc.integer({ min: 1, max: 4 }), tokenBudget: fc.option(fc.integer({ min: 1, max: 120 }), { nil: null }) }),
    guarded: fc.record({ input: fc.boolean(), answer: fc.boolean() }),
    iteration: fc.nat(2),
    inputTokens: fc.nat(30),
    inputChecked: fc.boolean(),
    lastText: fc.option(text, { nil: null }),
    calls: fc.array(toolCall, { minLength: 1, maxLength: 2 }),
    start: fc.oneof(
      fc.constant({ kind: 'fresh' as const }),
      fc.record({ kind: fc.constant('tools' as const), approved: fc.boolean() }),
      fc.record({ kind: fc.constant('guardrail' as const), stage: fc.constantFrom('input' as const, 'answer' as const), approved: fc.boolean(), answer: fc.option(text, { nil: null }) }),
      fc.record({ kind: fc.constant('input' as const), pending: pendingInput, value: fc.oneof(text, fc.integer(), fc.constant(null)) }),
      fc.record({ kind: fc.constant('tool_result' as const), content: text }),
    ),
  })
  .map(({ limits, guarded, iteration, inputTokens, inputChecked, lastText, calls, start }) => {
    const base = loopInput({ limits, guarded, iteration, inputTokens, inputChecked, lastText });
    switch (start.kind) {
      case 'fresh':
        return base;
      case 'tools':
        return {
          ...base,
          inputChecked: true,
          transcript: [...base.transcript, { role: 'assistant' as const, content: null, toolCalls: calls }],
          pendingApproval: { kind: 'tools' as const, calls, digest: 'd1' },
          resume: { kind: 'approval' as const, approved: start.approved, digest: 'd1' },
        };
      case 'guardrail':
        return {
          ...base,
          pendingApproval: { kind: 'guardrail' as const, stage: start.stage, guardrail: 'pii', reason: 'looks personal', answer: start.answer, digest: 'd2' },
          resume: { kind: 'approval' as const, approved: start.approved, digest: 'd2' },
        };
      case 'input':
        return { ...base, inputChecked: true, pendingInput: start.pending, resume: { kind: 'input' as const, value: start.value } };
      case 'tool_result':
        return {
          ...base,
          inputChecked: true,
          pendingDependency: { toolCallId: 'c1', toolName: 'remote_agent', dependencyId: 'dep-1' },
          resume: { kind: 'tool_result' as const, toolCallId: 'c1', toolName: 'remote_agent', content: start.content },
        };
    }
  });

async function expectSameLaw(input: LoopContext, steps: Script): Promise<Trace> {
  const viaActor = await throughActor(input, steps);
  const viaStepper = await throughStepper(input, steps);
  expect(viaStepper.values).toEqual(viaActor.values);
  expect(viaStepper.calls).toEqual(viaActor.calls);
  expect(viaStepper.result).toEqual(viaActor.result);
  return viaStepper;
}

const outputOf = (trace: Trace) => ('output' in trace.result ? trace.result.output : trace.result);

describe('the agent loop through the stepper and through an actor', () => {
  it('gives the same states, calls, context and output for any scripted run (fast-check)', async () => {
    await fc.assert(
      fc.asyncProperty(startArbitrary, scriptArbitrary, async (input, steps) => {
        await expectSameLaw(input, steps);
      }),
      { numRuns: 400 },
    );
  });

  const reply = (fields: Partial<Extract<ModelStepResult, { kind: 'reply' }>>): Scripted<ModelStepResult> => ({
    ok: { kind: 'reply', text: null, toolCalls: [], approvalRequired: false, providerIndex: 0, inputTokens: 10, outputTokens: 10, ...fields },
  });
  const call: ToolCall = { id: 'c1', name: 'lookup', arguments: { q: 'x' } };

  // Each kind of ending the executor settles, named, so none depends on what fast-check draws.
  const cases: { name: string; input?: Partial<LoopContext>; script: Partial<Script>; expected: unknown }[] = [
    { name: 'a model answer', script: { callModel: [reply({ text: 'hi' })] }, expected: { kind: 'complete', reason: 'completed', answer: 'hi', presentation: 'artifact' } },
    {
      name: 'a tool call, then an answer',
      script: { callModel: [reply({ toolCalls: [call] }), reply({ text: 'done' })], runTools: [{ ok: { kind: 'done', messages: [{ role: 'tool', toolCallId: 'c1', name: 'lookup', content: '42' }] } }] },
      expected: { kind: 'complete', reason: 'completed', answer: 'done', presentation: 'artifact' },
    },
    { name: 'a tool call needing approval', script: { callModel: [reply({ toolCalls: [call], approvalRequired: true })] }, expected: { kind: 'suspend', status: 'waiting_for_approval' } },
    {
      name: 'an input guardrail denial',
      script: { checkGuardrails: [{ ok: { verdict: 'deny', guardrail: 'pii', reason: 'no' } }] },
      expected: { kind: 'fail', reason: 'policy_denied', detail: { stage: 'input', guardrail: 'pii', reason: 'no' } },
    },
    {
      name: 'an answer guardrail asking for approval',
      script: { checkGuardrails: [{ ok: { verdict: 'allow' } }, { ok: { verdict: 'requireApproval', guardrail: 'tone', reason: 'check' } }], callModel: [reply({ text: 'rude' })] },
      expected: { kind: 'suspend', status: 'waiting_for_approval' },
    },
    {
      name: 'the token budget',
      input: { limits: { maxIterations: 9, tokenBudget: 15 } },
      script: { callModel: [reply({ toolCalls: [call], text: 'partial' })] },
      expected: { kind: 'complete', reason: 'budget_exhausted', answer: 'partial' },
    },
    {
      name: 'the iteration limit',
      input: { limits: { maxIterations: 2, tokenBudget: null } },
      script: { callModel: [reply({ toolCalls: [call], text: 'one' }), reply({ toolCalls: [call], text: 'two' })] },
      expected: { kind: 'complete', reason: 'max_iterations', answer: 'two' },
    },
    {
      name: 'input required by a tool',
      script: { callModel: [reply({ toolCalls: [call] })], runTools: [{ ok: { kind: 'input_required', messages: [], pending: { toolCallId: 'c1', toolName: 'lookup', prompt: 'which?', schema: {} } } }] },
      expected: { kind: 'suspend', status: 'waiting_for_input' },
    },
    { name: 'input required by the agent', script: { callModel: [reply({ outcome: { kind: 'input_required', prompt: 'more?' } })] }, expected: { kind: 'suspend', status: 'waiting_for_input' } },
    {
      name: 'a remote dependency',
      script: { callModel: [reply({ toolCalls: [call] })], runTools: [{ ok: { kind: 'dependency', messages: [], pending: { toolCallId: 'c1', toolName: 'remote_agent', dependencyId: 'dep-9' } } }] },
      expected: { kind: 'suspend', status: 'waiting_for_dependency' },
    },
    { name: 'a checkpoint stop', script: { checkpoint: [{ ok: { alive: false, why: 'cancelled' } }] }, expected: { kind: 'stop', why: 'cancelled' } },
    { name: 'a model failure', script: { callModel: [{ ok: { kind: 'failed', reason: 'provider_failed', errorClass: 'timeout', detail: {} } }] }, expected: { kind: 'fail', reason: 'provider_failed', detail: {}, errorClass: 'timeout' } },
    { name: 'a step error', script: { callModel: [reply({ toolCalls: [call] })], runTools: [{ throws: 'database gone' }] }, expected: { error: 'database gone' } },
  ];

  for (const { name, input, script: parts, expected } of cases) {
    it(`ends the same on ${name}`, async () => {
      const trace = await expectSameLaw(loopInput(input), script(parts));
      expect(outputOf(trace)).toEqual(expected);
    });
  }

  it('passes through the states the loop is drawn with', async () => {
    const trace = await expectSameLaw(loopInput(), script({ callModel: [reply({ toolCalls: [call] }), reply({ text: 'ok' })] }));
    expect(trace.values).toEqual(['checkpoint', 'checkingInput', 'callingModel', 'runningTools', 'checkpoint', 'callingModel', 'checkingAnswer', 'done']);
    expect(trace.calls.map((entry) => entry.src)).toEqual(['checkpoint', 'checkGuardrails', 'callModel', 'runTools', 'checkpoint', 'callModel', 'checkGuardrails']);
  });

  // An agent without a guardrail for a stage: the loop passes the stage without invoking the check,
  // and ends exactly as a guardrail that allows everything would have made it end.
  it('passes an unguarded stage as an allowing guardrail would, without invoking the check (fast-check)', async () => {
    // The other steps see the loop's context, which names the guarded stages: those are left out.
    const withoutGuardrailCalls = (trace: Trace) =>
      trace.calls
        .filter((entry) => entry.src !== 'checkGuardrails')
        .map(({ src, input }) => {
          const { context, ...rest } = input as { context: LoopContext };
          const { guarded: _guarded, ...shown } = context;
          return { src, input: { ...rest, context: shown } };
        });
    const withoutGuarded = (trace: Trace) => {
      if (!('context' in trace.result)) return trace.result;
      const { guarded: _guarded, ...context } = trace.result.context;
      return { output: trace.result.output, context };
    };
    await fc.assert(
      fc.asyncProperty(startArbitrary, scriptArbitrary, fc.record({ input: fc.boolean(), answer: fc.boolean() }), async (start, steps, guarded) => {
        const allowing = { ...steps, checkGuardrails: [] };
        const checked = await expectSameLaw({ ...start, guarded: ALL_STAGES_GUARDED }, allowing);
        const passed = await expectSameLaw({ ...start, guarded }, allowing);
        expect(withoutGuarded(passed)).toEqual(withoutGuarded(checked));
        expect(withoutGuardrailCalls(passed)).toEqual(withoutGuardrailCalls(checked));
        for (const entry of passed.calls) {
          if (entry.src === 'checkGuardrails') expect(guarded[(entry.input as { stage: 'input' | 'answer' }).stage]).toBe(true);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('runs an echo turn of an agent without guardrails as checkpoint, model call, done', async () => {
    const trace = await expectSameLaw(loopInput({ guarded: { input: false, answer: false } }), script({ callModel: [reply({ text: 'hi' })] }));
    expect(trace.values).toEqual(['checkpoint', 'callingModel', 'done']);
    expect(trace.calls.map((entry) => entry.src)).toEqual(['checkpoint', 'callModel']);
    expect(outputOf(trace)).toEqual({ kind: 'complete', reason: 'completed', answer: 'hi', presentation: 'artifact' });
    expect('context' in trace.result && trace.result.context.inputChecked).toBe(true);
  });

  it('checks only the stage a guardrail is configured for', async () => {
    const trace = await expectSameLaw(loopInput({ guarded: { input: false, answer: true } }), script({ callModel: [reply({ text: 'hi' })] }));
    expect(trace.values).toEqual(['checkpoint', 'callingModel', 'checkingAnswer', 'done']);
    expect(trace.calls.filter((entry) => entry.src === 'checkGuardrails').map((entry) => entry.input)).toEqual([{ stage: 'answer', text: 'hi' }]);
  });

  // The flat engine reads the loop's transitions once from its state nodes; XState's own
  // `transition` is the reference it must agree with snapshot by snapshot, not only at the end.
  it('computes the loop with the flat engine, snapshot for snapshot as XState computes it (fast-check)', async () => {
    expect(stepper.engine).toBe('flat');
    const reference = createMachineStepper(agentLoopMachine, { engine: 'xstate' });
    expect(reference.engine).toBe('xstate');
    const through = async (which: typeof stepper, input: LoopContext, steps: Script) => {
      const calls: Call[] = [];
      const snapshots: unknown[] = [];
      const onSnapshot = (snapshot: { status: string; value: StateValue; context: LoopContext }) =>
        snapshots.push(structuredClone({ status: snapshot.status, value: snapshot.value, context: snapshot.context }));
      try {
        const run = await which.run(structuredClone(input), scriptedSteps(steps, calls), { onSnapshot });
        return { snapshots, calls, result: { output: run.output, context: run.context, value: run.value } };
      } catch (error) {
        return { snapshots, calls, result: { error: (error as Error).message } };
      }
    };
    await fc.assert(
      fc.asyncProperty(startArbitrary, scriptArbitrary, async (input, steps) => {
        expect(await through(stepper, input, steps)).toEqual(await through(reference, input, steps));
      }),
      { numRuns: 400 },
    );
  });

  it('lets concurrent runs share one stepper', async () => {
    const runs = await Promise.all(
      Array.from({ length: 20 }, (_, index) => throughStepper(loopInput(), script({ callModel: [reply({ toolCalls: [call] }), reply({ text: `answer ${index}` })] }))),
    );
    runs.forEach((trace, index) => expect(outputOf(trace)).toMatchObject({ kind: 'complete', answer: `answer ${index}` }));
  });
});

describe('the stepper on other machines', () => {
  const gather = setup({
    types: { context: {} as { log: string[] }, output: {} as string[] },
    actors: {
      fast: fromPromise<string, { label: string }>(async () => 'unused'),
      slow: fromPromise<string, { label: string }>(async () => 'unused'),
    },
  }).createMachine({
    id: 'gather',
    context: { log: [] },
    initial: 'both',
    states: {
      both: {
        type: 'parallel',
        states: {
          left: {
            initial: 'working',
            states: {
              working: {
                invoke: {
                  src: 'fast',
                  input: { label: 'left' },
                  onDone: { target: '#gather.after', actions: assign({ log: ({ context, event }) => [...context.log, `fast:${event.output}`] }) },
                  onError: { target: '#gather.after', actions: assign({ log: ({ context }) => [...context.log, 'fast failed'] }) },
                },
              },
            },
          },
          right: {
            initial: 'working',
            states: {
              working: {
                invoke: { id: 'slowOne', src: 'slow', input: { label: 'right' }, onDone: { actions: assign({ log: ({ context, event }) => [...context.log, `slow:${event.output}`] }) } },
              },
            },
          },
        },
      },
      after: { type: 'final' },
    },
    output: ({ context }) => context.log,
  });

  it('runs parallel invokes together, and aborts and drops the one whose state is left', async () => {
    let slowSignal: AbortSignal | null = null;
    let releaseSlow: (value: string) => void = () => undefined;
    const values: StateValue[] = [];
    const run = await createMachineStepper(gather).run(
      undefined,
      {
        fast: async ({ label }) => `${label} done`,
        slow: ({ label }, { signal }) => {
          slowSignal = signal;
          return new Promise<string>((resolve) => (releaseSlow = () => resolve(`${label} late`)));
        },
      },
      { onSnapshot: (snapshot) => values.push(snapshot.value) },
    );
    releaseSlow('late');
    expect(run.output).toEqual(['fast:left done']);
    expect(slowSignal!.aborted).toBe(true);
    expect(values).toEqual([{ both: { left: 'working', right: 'working' } }, 'after']);

    // The actor path agrees.
    const actor = createActor(gather.provide({ actors: { fast: fromPromise(async ({ input }) => `${input.label} done`), slow: fromPromise(() => new Promise<string>(() => undefined)) } }));
    actor.start();
    expect(await toPromise(actor)).toEqual(run.output);
  });

  it('delivers a step error to onError', async () => {
    const run = await createMachineStepper(gather).run(undefined, {
      fast: async () => {
        throw new Error('no');
      },
      slow: () => new Promise<string>(() => undefined),
    });
    expect(run.output).toEqual(['fast failed']);
  });

  it('rejects with an unhandled step error, as toPromise does', async () => {
    const single = setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'working',
      states: { working: { invoke: { src: 'work', onDone: 'finished' } }, finished: { type: 'final' } },
    });
    await expect(
      createMachineStepper(single).run(undefined, {
        work: () => {
          throw new Error('broken step');
        },
      }),
    ).rejects.toThrow('broken step');
  });

  it('refuses a run without a step for an invoked actor', async () => {
    await expect(createMachineStepper(gather).run(undefined, { fast: async () => 'x' } as unknown as MachineSteps<typeof gather>)).rejects.toThrow('no step function for slow');
  });

  it('refuses a machine at rest with nothing running, which would wait forever', async () => {
    const waiting = setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'working',
      states: { working: { invoke: { src: 'work', onDone: 'idle' } }, idle: { on: { GO: 'finished' } }, finished: { type: 'final' } },
    });
    await expect(createMachineStepper(waiting).run(undefined, { work: async () => 1 })).rejects.toThrow('rests in "idle" with no step running');
  });

  it('refuses at creation a machine with effects it cannot carry out, naming each', () => {
    const effects: AnyStateMachine = setup({
      actors: { work: fromPromise<number>(async () => 1) },
      actions: { notify: () => undefined },
      delays: { soon: 10 },
    }).createMachine({
      initial: 'working',
      entry: 'notify',
      states: {
        working: {
          invoke: { src: fromPromise(async () => 2), onDone: 'waiting' },
          exit: [({ self }) => void self, sendTo(({ self }) => self, { type: 'PING' })],
        },
        waiting: { after: { soon: 'finished' } },
        finished: { type: 'final' },
      },
    });
    let message = '';
    try {
      createMachineStepper(effects);
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toContain('cannot be stepped');
    expect(message).toContain('a custom action');
    expect(message).toContain('xstate.sendTo');
    expect(message).toContain('an invoke of inline logic');
    expect(message).toContain('delayed transitions (after)');
    expect(createMachineStepper(agentLoopMachine).invokedSources).toEqual(['checkpoint', 'checkGuardrails', 'callModel', 'runTools']);
  });
});

describe('the flat engine against XState on small flat machines', () => {
  type Outcome = { values: StateValue[]; result: { output: unknown; context: unknown } | { error: string } };

  type Steps = Record<string, (input: never) => Promise<unknown>>;

  /**
   * The machine run three ways (an actor, the flat engine, XState's transition), each with fresh
   * steps from `stepsOf`; a machine that is not flat runs two ways.
   */
  async function threeWays(machine: AnyStateMachine, stepsOf: () => Steps, input?: unknown, engines: ('flat' | 'xstate')[] = ['flat', 'xstate']): Promise<Outcome[]> {
    const viaActor = async (): Promise<Outcome> => {
      const steps = stepsOf();
      const actors = Object.fromEntries(Object.entries(steps).map(([name, step]) => [name, fromPromise(({ input: stepInput }) => step(stepInput as never))]));
      const values: StateValue[] = [];
      const actor = createActor(machine.provide({ actors }), { input });
      actor.subscribe({ next: (snapshot) => values.push(snapshot.value), error: () => undefined });
      actor.start();
      try {
        const output = await toPromise(actor);
        return { values, result: { output, context: actor.getSnapshot().context } };
      } catch (error) {
        return { values, result: { error: (error as Error).message } };
      }
    };
    const viaStepper = async (engine: 'flat' | 'xstate'): Promise<Outcome> => {
      const values: StateValue[] = [];
      const stepped = createMachineStepper(machine, { engine });
      expect(stepped.engine).toBe(engine);
      try {
        const run = await stepped.run(input as never, stepsOf() as never, { onSnapshot: (snapshot) => values.push(snapshot.value) });
        return { values, result: { output: run.output, context: run.context } };
      } catch (error) {
        return { values, result: { error: (error as Error).message } };
      }
    };
    const outcomes = [await viaActor()];
    for (const engine of engines) outcomes.push(await viaStepper(engine));
    return outcomes;
  }

  const expectAgreement = (outcomes: Outcome[]) => {
    for (const outcome of outcomes.slice(1)) expect(outcome).toEqual(outcomes[0]);
    return outcomes[0]!;
  };

  // Named guards with params, named assigns with params (static and computed), targetless eventless
  // transitions that act until their guard turns false, guards that read the macrostep's event, a
  // static invoke input, and the final state's output reaching the root's output.
  const counter = setup({
    types: { context: {} as { count: number; seen: string[]; limit: number }, input: {} as { limit: number }, output: {} as { total: number; note: unknown } },
    actors: { tick: fromPromise<number, { step: number }>(async () => 0) },
    guards: {
      below: ({ context }, params: { limit: number }) => context.count < params.limit,
      outputIs: ({ event }, params: { value: number }) => (event as { output?: unknown }).output === params.value,
    },
    actions: {
      add: assign({ count: ({ context }, params: { by: number }) => context.count + params.by }),
      note: assign(({ context }, params: { what: string }) => ({ seen: [...context.seen, params.what] })),
    },
  }).createMachine({
    id: 'counter',
    context: ({ input }) => ({ count: 0, seen: [], limit: input.limit }),
    initial: 'counting',
    states: {
      counting: {
        always: [
          { guard: { type: 'below', params: ({ context }) => ({ limit: context.limit }) }, actions: [{ type: 'add', params: { by: 1 } }, { type: 'note', params: ({ context }) => ({ what: `at ${context.count}` }) }] },
          { target: 'ticking' },
        ],
      },
      ticking: {
        invoke: {
          src: 'tick',
          input: { step: 2 },
          onDone: [
            { guard: { type: 'outputIs', params: { value: 7 } }, target: 'finished', actions: { type: 'note', params: { what: 'seven' } } },
            { target: 'waited', actions: assign({ count: ({ context, event }) => context.count + event.output }) },
          ],
          onError: { target: 'finished', actions: { type: 'note', params: { what: 'tick failed' } } },
        },
      },
      waited: {
        always: [
          { guard: ({ event }) => event.type.startsWith('xstate.done.actor.') && (event as unknown as { output: number }).output > 100, target: 'finished', actions: { type: 'note', params: { what: 'big' } } },
          { target: 'ticking', guard: ({ context }) => context.count < 20 },
          { target: 'finished' },
        ],
      },
      finished: { type: 'final', output: ({ context }) => `ended at ${context.count}` },
    },
    output: ({ context, event }) => ({ total: context.count, note: (event as { output?: unknown }).output }),
  });

  it('computes guards, assigns, eventless transitions and output as XState does', async () => {
    const ticks = (outputs: number[]) => () => {
      let call = 0;
      return { tick: async (input: { step: number }) => (outputs[call++] ?? 0) * input.step };
    };
    const outcome = expectAgreement(await threeWays(counter, ticks([5, 7]), { limit: 3 }));
    expect(outcome.values).toEqual(['ticking', 'ticking', 'finished']);
    expect(outcome.result).toMatchObject({ output: { total: 3 + 10 + 14, note: 'ended at 27' } });
    const big = expectAgreement(await threeWays(counter, ticks([60]), { limit: 0 }));
    expect(big.result).toMatchObject({ output: { total: 120, note: 'ended at 120' }, context: { seen: ['big'] } });
    const seven = expectAgreement(await threeWays(counter, () => ({ tick: async () => 7 }), { limit: 1 }));
    expect(seven.values).toEqual(['ticking', 'finished']);
    // A computed action param sees the context the action before it left.
    expect(seven.result).toMatchObject({ context: { seen: ['at 1', 'seven'] } });
  });

  it('takes onError for a step that fails, and rejects with an error no transition takes', async () => {
    const handled = expectAgreement(await threeWays(counter, () => ({ tick: async () => { throw new Error('tick broke'); } }), { limit: 0 }));
    expect(handled.result).toMatchObject({ context: { seen: ['tick failed'] } });

    const unhandled = setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'working',
      context: { tries: 0 },
      states: { working: { invoke: { src: 'work', onDone: 'finished' } }, finished: { type: 'final' } },
    });
    const rejected = expectAgreement(await threeWays(unhandled, () => ({ work: async () => { throw new Error('broken step'); } })));
    expect(rejected.result).toEqual({ error: 'broken step' });
    // A machine without an output ends with none.
    const plain = expectAgreement(await threeWays(unhandled, () => ({ work: async () => 1 })));
    expect(plain.result).toEqual({ output: undefined, context: { tries: 0 } });
  });

  it('leaves a done event no transition takes at rest, as XState does', async () => {
    const picky = setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'working',
      states: { working: { invoke: { src: 'work', onDone: { guard: ({ event }) => event.output > 1, target: 'finished' } } }, finished: { type: 'final' } },
    });
    const outcomes = await threeWays(picky, () => ({ work: async () => 2 }));
    expectAgreement(outcomes);
    await expect(createMachineStepper(picky).run(undefined, { work: async () => 1 })).rejects.toThrow('rests in "working" with no step running');
    await expect(createMachineStepper(picky, { engine: 'xstate' }).run(undefined, { work: async () => 1 })).rejects.toThrow('rests in "working" with no step running');
  });

  it('leaves every machine that is not flat to XState, naming why when flat is asked for', async () => {
    const guardedTwice = setup({ actors: { work: fromPromise<number>(async () => 1) }, guards: { yes: () => true } }).createMachine({
      initial: 'working',
      states: { working: { invoke: { src: 'work', onDone: { guard: and(['yes', 'yes']), target: 'finished' } } }, finished: { type: 'final' } },
    });
    const again = setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'working',
      context: { n: 0 },
      states: {
        working: { invoke: { src: 'work', onDone: [{ guard: ({ context }) => context.n < 2, target: 'working', reenter: true, actions: assign({ n: ({ context }) => context.n + 1 }) }, { target: 'finished' }] } },
        finished: { type: 'final' },
      },
    });
    const entered = setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'working',
      context: { n: 0 },
      states: { working: { entry: assign({ n: 1 }), invoke: { src: 'work', onDone: 'finished' } }, finished: { type: 'final' } },
    });
    const wildcard = setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'working',
      states: { working: { invoke: { src: 'work' }, on: { '*': 'finished' } }, finished: { type: 'final' } },
    });
    const cases: [AnyStateMachine, string][] = [
      [gatherLike(), 'is parallel'],
      [guardedTwice, 'a higher-order guard'],
      [again, 'a transition to its own state'],
      [entered, 'has entry or exit actions'],
      [wildcard, 'a wildcard event'],
    ];
    for (const [machine, reason] of cases) {
      expect(createMachineStepper(machine).engine).toBe('xstate');
      expect(() => createMachineStepper(machine, { engine: 'flat' })).toThrow(reason);
    }
    // XState still runs them: the self-targeting one re-enters its state and invokes again.
    const repeated = expectAgreement(await threeWays(again, () => ({ work: async () => 1 }), undefined, ['xstate']));
    expect(repeated.values).toEqual(['working', 'working', 'working', 'finished']);
  });

  function gatherLike(): AnyStateMachine {
    return setup({ actors: { work: fromPromise<number>(async () => 1) } }).createMachine({
      initial: 'both',
      states: { both: { type: 'parallel', states: { a: { invoke: { src: 'work' } }, b: {} } } },
    });
  }
});
