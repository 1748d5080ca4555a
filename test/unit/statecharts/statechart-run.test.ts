import { assign, emit, setup } from 'xstate';
import { describe, expect, it } from 'vitest';
import { checkStatechart, definitionHash, type StatechartDefinition } from '../../../src/statecharts/statechart-definition.js';
import { INLINE_TIMER_MS, runStatechart, type CommitInput, type MachineRecord, type StatechartHost, type StepOutcome } from '../../../src/statecharts/statechart-run.js';
import { askInput, defineStep, type StepMarker } from '../../../src/statecharts/steps.js';

// The durable stepper with an in-memory host: what it commits at each transition, how a record
// restores, what a step's outcome does, and how time and versions are handled.

const work = defineStep<{ n: number }, number>({ effect: 'idempotent_write', run: async ({ n }) => n + 1 });
const fragile = defineStep<null, never>({ effect: 'read_only', run: async () => Promise.reject(new Error('secret 4111')) });

function definitionOf(machine: Parameters<typeof checkStatechart>[0]): StatechartDefinition {
  const checked = checkStatechart(machine, 'test');
  if (!checked.ok) throw new Error(checked.problems.join('\n'));
  return { machine, path: 'test', hash: definitionHash(machine), steps: checked.steps };
}

const counter = setup({ types: { context: {} as { n: number } }, actors: { work, ask: askInput } }).createMachine({
  id: 'counter',
  context: { n: 0 },
  initial: 'first',
  states: {
    first: { meta: { status: 'one' }, invoke: { src: 'work', input: ({ context }) => ({ n: context.n }), onDone: { target: 'second', actions: assign({ n: ({ event }) => event.output }) } } },
    second: {
      invoke: {
        src: 'work',
        input: ({ context }) => ({ n: context.n }),
        onDone: { target: 'asking', actions: [assign({ n: ({ event }) => event.output }), emit({ type: 'artifact', name: 'n', text: 'two' } as { type: 'artifact' })] },
      },
    },
    asking: { invoke: { id: 'question', src: 'ask', input: { prompt: 'more?' }, onDone: 'done' } },
    done: { type: 'final' },
  },
  output: ({ context }) => ({ text: `n=${context.n}` }),
});

type Host = StatechartHost & { commits: CommitInput[]; performed: string[] };

function memoryHost(perform?: (src: string, marker: StepMarker, input: unknown) => Promise<StepOutcome>): Host {
  const commits: CommitInput[] = [];
  const performed: string[] = [];
  return {
    commits,
    performed,
    checkpoint: async () => ({ alive: true }),
    commit: async (input) => {
      commits.push(structuredClone(input));
      return true;
    },
    perform: async (step, marker) => {
      performed.push(step.src);
      if (perform) return perform(step.src, marker, step.input);
      if (marker.kind === 'askInput') return { kind: 'wait', status: 'waiting_for_input', pending: step.input };
      return { kind: 'done', output: await marker.run!(step.input as never, {} as never) };
    },
  };
}

describe('runStatechart', () => {
  it('commits every transition with what it shows, and waits where someone must answer', async () => {
    const host = memoryHost();
    const result = await runStatechart(definitionOf(counter), { record: null, input: {}, answer: null }, host);
    expect(result.kind).toBe('wait');
    expect(host.commits.map((commit) => [commit.value, commit.event, commit.shown.statuses, commit.shown.artifacts.map((artifact) => artifact.name)])).toEqual([
      ['first', 'xstate.init', ['one'], []],
      ['second', 'xstate.done.actor.0.counter.first', [], []],
      ['asking', 'xstate.done.actor.0.counter.second', [], ['n']],
    ]);
    const last = host.commits.at(-1)!.record;
    expect(last.running.map((step) => step.id)).toEqual(['question']);
    expect(last.transitions).toBe(3);
  });

  it('restores from a record: the step left in flight runs again, the committed ones do not', async () => {
    const first = memoryHost();
    await runStatechart(definitionOf(counter), { record: null, input: {}, answer: null }, first);
    // As if the process died after the first commit, with `second`'s step in flight.
    const afterFirst = JSON.parse(JSON.stringify(first.commits[1]!.record)) as MachineRecord;
    const second = memoryHost();
    const result = await runStatechart(definitionOf(counter), { record: afterFirst, input: null, answer: null }, second);
    expect(second.performed).toEqual(['work', 'ask']);
    expect(result.kind).toBe('wait');
    const waiting = JSON.parse(JSON.stringify(second.commits.at(-1)!.record)) as MachineRecord;
    const done = await runStatechart(definitionOf(counter), { record: waiting, input: null, answer: { stepId: 'question', output: 'yes' } }, memoryHost());
    expect(done).toMatchObject({ kind: 'complete', output: { text: 'n=2' } });
  });

  it('a step error goes to the machine; unhandled, the run fails with state names in the detail and the text apart', async () => {
    const handles = setup({ actors: { fragile } }).createMachine({
      id: 'handles',
      initial: 'trying',
      states: { trying: { invoke: { src: 'fragile', input: null, onError: 'recovered' } }, recovered: { type: 'final' } },
    });
    expect((await runStatechart(definitionOf(handles), { record: null, input: {}, answer: null }, memoryHost())).kind).toBe('complete');
    const ignores = setup({ actors: { fragile } }).createMachine({ id: 'ignores', initial: 'trying', states: { trying: { invoke: { src: 'fragile', input: null, onDone: 'trying' } } } });
    const failed = await runStatechart(definitionOf(ignores), { record: null, input: {}, answer: null }, memoryHost());
    // The invoke without an id of its own is numbered by XState: the step is named as the machine names it.
    expect(failed).toMatchObject({ kind: 'fail', detail: { reason: 'machine_error', state: 'trying', errorClass: 'Error' } });
    expect(JSON.stringify(failed.kind === 'fail' && failed.detail)).not.toContain('4111');
    expect(failed.kind === 'fail' && failed.error).toMatchObject({ errorClass: 'Error', message: 'secret 4111' });
    expect(failed.kind === 'fail' && failed.error?.step).toBe((failed.kind === 'fail' && failed.detail.step) as string);
  });

  it('a short delay is waited for in process; a long one suspends with its due time, and a left state cancels its timer', async () => {
    const timed = (ms: number) =>
      setup({ actors: { work } }).createMachine({
        id: `timed${ms}`,
        initial: 'waiting',
        states: { waiting: { after: { [ms]: 'done' }, invoke: { src: 'work', input: { n: 1 }, onDone: 'worked' } }, worked: { after: { [ms]: 'done' } }, done: { type: 'final' } },
      });
    const short = await runStatechart(definitionOf(timed(20)), { record: null, input: {}, answer: null }, memoryHost());
    expect(short.kind).toBe('complete');
    const before = Date.now();
    const long = await runStatechart(definitionOf(timed(INLINE_TIMER_MS + 60_000)), { record: null, input: {}, answer: null }, memoryHost());
    expect(long.kind).toBe('sleep');
    if (long.kind !== 'sleep') return;
    // The first state's timer was cancelled when the step's outcome left it: one timer, the second state's.
    expect(long.record.timers).toHaveLength(1);
    expect(long.record.timers[0]!.id).toContain('worked');
    expect(long.dueAt).toBeGreaterThanOrEqual(before + INLINE_TIMER_MS + 60_000);
  });

  it('a record whose state or awaited step the current definition lacks fails as machine_version, naming both versions', async () => {
    const host = memoryHost();
    await runStatechart(definitionOf(counter), { record: null, input: {}, answer: null }, host);
    const waiting = JSON.parse(JSON.stringify(host.commits.at(-1)!.record)) as MachineRecord;
    const renamedState = setup({ actors: { work, ask: askInput } }).createMachine({ id: 'counter', initial: 'first', states: { first: { invoke: { src: 'work', input: { n: 0 }, onDone: 'done' } }, done: { type: 'final' } } });
    const v2 = definitionOf(renamedState);
    expect(await runStatechart(v2, { record: waiting, input: null, answer: null }, memoryHost())).toEqual({
      kind: 'fail',
      detail: { reason: 'machine_version', state: 'asking', startedWith: waiting.startedWith, current: v2.hash },
    });
    const renamedInvoke = setup({ actors: { work, ask: askInput } }).createMachine({
      id: 'counter',
      initial: 'asking',
      states: { first: {}, second: {}, asking: { invoke: { id: 'renamed', src: 'ask', input: { prompt: 'more?' }, onDone: 'done' } }, done: { type: 'final' } },
    });
    const v3 = definitionOf(renamedInvoke);
    expect(await runStatechart(v3, { record: waiting, input: null, answer: { stepId: 'question', output: 'yes' } }, memoryHost())).toMatchObject({
      kind: 'fail',
      detail: { reason: 'machine_version', state: 'asking', step: 'question' },
    });
  });

  it('a restored run that leaves a waiting state by its deadline drops the step it waited on', async () => {
    const deadline = setup({ actors: { ask: askInput } }).createMachine({
      id: 'deadline',
      initial: 'asking',
      states: { asking: { invoke: { id: 'question', src: 'ask', input: { prompt: 'when?' }, onDone: 'answered' }, after: { 50: 'late' } }, answered: { type: 'final' }, late: { type: 'final' } },
    });
    const definition = definitionOf(deadline);
    const first = memoryHost();
    // The deadline is short, so the first run waits it out in process; take the record it committed at the start instead.
    await runStatechart(definition, { record: null, input: {}, answer: null }, first);
    const atStart = JSON.parse(JSON.stringify(first.commits[0]!.record)) as MachineRecord;
    expect(atStart.running.map((step) => step.id)).toEqual(['question']);
    const restored = memoryHost();
    const result = await runStatechart(definition, { record: atStart, input: null, answer: null }, restored);
    expect(result.kind).toBe('complete');
    const last = restored.commits.at(-1)!;
    expect([last.value, last.record.running]).toEqual(['late', []]);
  });

  it('refuses at load a machine with an effect it could not carry out durably', () => {
    const effectful = setup({ actors: { work } }).createMachine({
      id: 'effectful',
      initial: 'a',
      states: { a: { entry: () => console.log('side effect'), invoke: { src: 'work', input: { n: 1 } } } },
    });
    const checked = checkStatechart(effectful, 'test');
    expect(checked.ok === false && checked.problems.join('\n')).toMatch(/a custom action .*put effects in a step/);
  });

  it('a cancel ends the wait for a step or for an in-process timer at once (decision 0066)', async () => {
    const waiting = setup({ actors: { work } }).createMachine({
      id: 'waiting',
      initial: 'working',
      states: {
        working: { invoke: { src: 'work', input: { n: 1 }, onDone: 'pausing' } },
        pausing: { after: { [INLINE_TIMER_MS - 500]: 'done' } },
        done: { type: 'final' },
      },
    });
    // A step that never answers: the cancel, not the step, ends the run's wait.
    const cancelled = new AbortController();
    const stuck = { ...memoryHost(() => new Promise<StepOutcome>(() => undefined)), cancelled: cancelled.signal };
    const run = runStatechart(definitionOf(waiting), { record: null, input: {}, answer: null }, stuck);
    setTimeout(() => cancelled.abort(), 20);
    await expect(run).resolves.toEqual({ kind: 'stop', why: 'cancelled' });
    // An in-process timer: stopped before it is due.
    const timerCancel = new AbortController();
    const timed = { ...memoryHost(), cancelled: timerCancel.signal };
    const startedAt = Date.now();
    const sleeping = runStatechart(definitionOf(waiting), { record: null, input: {}, answer: null }, timed);
    setTimeout(() => timerCancel.abort(), 200);
    await expect(sleeping).resolves.toEqual({ kind: 'stop', why: 'cancelled' });
    expect(Date.now() - startedAt).toBeLessThan(INLINE_TIMER_MS - 500);
    expect(timed.commits.map((commit) => commit.value)).toEqual(['working', 'pausing']);
  });
});
