// The sources `keel new agent` and `keel new project` write for a statechart agent: a small machine
// that uses Keel's steps, and a vitest test that runs it in memory with stand-ins for the steps.

export function agentMachineSource(name: string): string {
  return `import { assign, setup } from 'xstate';
import { askInput, callModel, type CallModelOutput, type StatechartOutput } from 'keel/statechart';

// The ${name} agent, written as a statechart (Keel: docs/statechart-agents.md). Keel runs each run of
// it durably: every transition is committed, so a crash resumes from the last state reached. Work
// happens only in Keel's steps, invoked by the names given in setup({ actors }): callModel (the
// agent's provider), callTool (one of its tools), askInput (the client answers), askApproval (an
// operator decides), callRemoteAgent, or a step of your own made with defineStep(). Entering a state
// with meta.status shows that message to the client; the final state's output is the answer.

/** The model answers this when it needs more detail before it can answer. */
export const NEED_DETAIL = 'NEED_DETAIL';

type Context = {
  /** What the client added when asked for detail. */
  detail: string | null;
  answer: string | null;
};

/** The model asked for more detail, and has not had it yet (a named guard: the drawing shows its name). */
const needsDetail = ({ context, event }: { context: Context; event: { output: CallModelOutput } }) =>
  event.output.text?.trim() === NEED_DETAIL && context.detail === null;

export const machine = setup({
  types: {
    context: {} as Context,
    output: {} as StatechartOutput,
  },
  actors: { callModel, askInput },
}).createMachine({
  id: '${name}',
  initial: 'answering',
  context: { detail: null, answer: null },
  states: {
    answering: {
      meta: { status: 'Working on an answer' },
      invoke: {
        // An id of its own: a run waiting here gets its answer by it, also from a later version.
        id: 'answer',
        src: 'callModel',
        // Without a prompt the model reads the task's messages; the detail asked for comes after them.
        input: ({ context }) => ({
          system: \`Answer the user's request. If you cannot without more detail, answer exactly \${NEED_DETAIL}.\`,
          ...(context.detail === null ? {} : { prompt: \`More detail: \${context.detail}\` }),
        }),
        onDone: [
          { guard: needsDetail, target: 'askingDetail' },
          { target: 'answered', actions: assign({ answer: ({ event }) => event.output.text }) },
        ],
      },
    },
    askingDetail: {
      meta: { status: 'Waiting for more detail' },
      invoke: {
        id: 'askDetail',
        src: 'askInput',
        input: { prompt: 'Could you tell me a little more?' },
        // The reply's data part if it has one, else its text.
        onDone: {
          target: 'answering',
          actions: assign({ detail: ({ event }) => (typeof event.output === 'string' ? event.output : JSON.stringify(event.output)) }),
        },
      },
    },
    answered: { type: 'final' },
  },
  output: ({ context }) => ({ text: context.answer ?? '', data: { askedForDetail: context.detail !== null } }),
});

export default machine;
`;
}

export function agentTestSource(name: string): string {
  return `import { describe, expect, it } from 'vitest';
import { createActor, fromPromise, toPromise } from 'xstate';
import type { CallModelInput, CallModelOutput } from 'keel/statechart';
import { machine, NEED_DETAIL } from './${name}.machine.js';

// Runs the ${name} machine in memory: Keel's steps run only inside a Keel run, so the test provides
// stand-ins for them (machine.provide) and checks the path the machine takes and its output.

function run(replies: string[], detail = 'the order number is 42') {
  const calls: CallModelInput[] = [];
  const prompts: string[] = [];
  const actor = createActor(
    machine.provide({
      actors: {
        callModel: fromPromise<CallModelOutput, CallModelInput>(async ({ input }) => {
          calls.push(input);
          return { text: replies.shift() ?? null };
        }),
        askInput: fromPromise<unknown, { prompt: string }>(async ({ input }) => {
          prompts.push(input.prompt);
          return detail;
        }),
      },
    }),
  );
  const output = toPromise(actor);
  actor.start();
  return { output, calls, prompts };
}

describe('${name} machine', () => {
  it('answers with the model\\'s reply', async () => {
    const { output, calls, prompts } = run(['Here is your answer.']);
    expect(await output).toEqual({ text: 'Here is your answer.', data: { askedForDetail: false } });
    expect(calls).toHaveLength(1);
    expect(prompts).toEqual([]);
  });

  it('asks the client for detail when the model needs it, then answers', async () => {
    const { output, calls, prompts } = run([NEED_DETAIL, 'Order 42 ships tomorrow.']);
    expect(await output).toEqual({ text: 'Order 42 ships tomorrow.', data: { askedForDetail: true } });
    expect(prompts).toEqual(['Could you tell me a little more?']);
    expect(calls[1]?.prompt).toBe('More detail: the order number is 42');
  });
});
`;
}
