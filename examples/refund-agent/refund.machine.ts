import { assign, emit, setup } from 'xstate';
// In a project of your own: import { askApproval, askInput, callModel, callTool } from 'keel/statechart';
import { askApproval, askInput, callModel, callTool, type AskApprovalOutput, type CallModelOutput, type StatechartOutput } from '../../src/statecharts/steps.js';

// A refund agent written as a statechart (docs/statechart-agents.md, README "Write an agent as a
// statechart"). The model reads the customer's message and answers with the amount and the reason;
// without an amount the agent asks the customer for it; above REFUND_LIMIT an operator approves;
// then the `issue_refund` tool (./tools.ts) pays it out. Keel commits every transition, so a crash
// anywhere resumes from the last state reached, and each step's effect says whether it may run
// again: the model call is a read, the refund an idempotent write keyed by its step.

/** Refunds above this amount need an operator's approval. */
export const REFUND_LIMIT = 100;

export const CLASSIFY_PROMPT =
  'Read the customer\'s refund request. Answer only with JSON: {"amount": <the amount asked for, a number, or null when the message names none>, "reason": "<the reason in a few words>"}.';

export const AMOUNT_PROMPT = 'What was the amount of the order you want refunded? (for example: 120)';

type Refund = { refundId: string; amount: number; reason: string; issuedAt: string };

type RefundContext = {
  /** The amount to refund, once known (from the model, else from the customer). */
  amount: number | null;
  reason: string;
  refund: Refund | null;
  /** Why nothing was refunded, when nothing was. */
  declined: string | null;
};

/** An amount from whatever carried it: a number, a text such as "120", "$1,200" or "12,50 EUR", or an object with `amount`. */
export function amountOf(value: unknown): number | null {
  if (typeof value === 'number') return Number.isFinite(value) && value > 0 ? value : null;
  if (typeof value === 'string') {
    // A comma before three digits separates thousands ("1,200"); before one or two, decimals ("12,50").
    const match = /\d+(?:[.,]\d{1,2})?/.exec(value.replace(/(\d),(?=\d{3}\b)/g, '$1'));
    return match ? amountOf(Number(match[0].replace(',', '.'))) : null;
  }
  if (typeof value === 'object' && value !== null && 'amount' in value) return amountOf((value as { amount: unknown }).amount);
  return null;
}

/** The reason from the model's JSON answer, else its text. */
function reasonOf(reply: CallModelOutput): string {
  const reason = (reply.data as { reason?: unknown } | undefined)?.reason;
  if (typeof reason === 'string' && reason.trim() !== '') return reason.trim();
  return reply.text?.trim() || 'no reason given';
}

/** The operator's decision, as the askApproval step outputs it (a named function: the drawing shows its name). */
const approved = ({ event }: { event: { output: AskApprovalOutput } }) => event.output.approved;

const money = (amount: number | null) => (amount === null ? 'an unknown amount' : amount.toFixed(2));

export const machine = setup({
  types: {
    context: {} as RefundContext,
    output: {} as StatechartOutput,
    emitted: {} as { type: 'artifact'; name: string; data: unknown; lastChunk: boolean },
  },
  // Only Keel's steps: each is a durable step of the run, with the effect it declares.
  actors: { callModel, askInput, askApproval, callTool },
  guards: {
    amountUnknown: ({ context }) => context.amount === null,
    aboveLimit: ({ context }) => context.amount !== null && context.amount > REFUND_LIMIT,
  },
}).createMachine({
  id: 'refund',
  initial: 'classifying',
  context: { amount: null, reason: '', refund: null, declined: null },
  // Each invoke has an id of its own: a run waiting in a state gets its answer by that id, so a later
  // version of the machine keeps it (docs/statechart-agents.md, "Versions").
  states: {
    classifying: {
      meta: { status: 'Reading the refund request' },
      invoke: {
        id: 'classify',
        src: 'callModel',
        // No prompt: the model reads the task's messages after this system message.
        input: { system: CLASSIFY_PROMPT },
        onDone: {
          target: 'checking',
          actions: assign(({ event }) => ({ amount: amountOf(event.output.data), reason: reasonOf(event.output) })),
        },
      },
    },
    // A state the machine only passes through: it decides where to go with what is known, within the
    // transition that led here (nothing is committed in it).
    checking: {
      always: [
        { guard: 'amountUnknown', target: 'askingAmount' },
        { guard: 'aboveLimit', target: 'awaitingApproval' },
        { target: 'refunding' },
      ],
    },
    askingAmount: {
      meta: { status: 'Waiting for the order amount' },
      invoke: {
        id: 'askAmount',
        src: 'askInput',
        input: {
          prompt: AMOUNT_PROMPT,
          // A text reply ("120", "it was $120") or a data part {"amount": 120}; Keel refuses any other reply and keeps waiting.
          schema: {
            anyOf: [
              { type: 'string', minLength: 1 },
              { type: 'object', properties: { amount: { type: 'number', exclusiveMinimum: 0 } }, required: ['amount'] },
            ],
          },
        },
        // A text without a usable amount asks again.
        onDone: { target: 'checking', actions: assign(({ event }) => ({ amount: amountOf(event.output) })) },
      },
    },
    awaitingApproval: {
      meta: { status: `Waiting for an operator to approve a refund above ${REFUND_LIMIT}` },
      invoke: {
        id: 'approval',
        src: 'askApproval',
        input: ({ context }) => ({
          summary: `Refund ${money(context.amount)} (above the limit of ${REFUND_LIMIT}): ${context.reason}`,
          details: { amount: context.amount, reason: context.reason, limit: REFUND_LIMIT },
        }),
        onDone: [
          { guard: approved, target: 'refunding' },
          { target: 'declined', actions: assign({ declined: 'an operator declined the refund' }) },
        ],
      },
    },
    refunding: {
      meta: { status: 'Issuing the refund' },
      invoke: {
        id: 'refund',
        src: 'callTool',
        input: ({ context }) => ({ tool: 'issue_refund', arguments: { amount: context.amount, reason: context.reason } }),
        onDone: {
          target: 'refunded',
          actions: [
            assign({ refund: ({ event }) => event.output as Refund }),
            // Shown to the client at once as an artifact update, committed with this transition.
            emit(({ event }) => ({ type: 'artifact' as const, name: 'receipt', data: event.output, lastChunk: true })),
          ],
        },
        onError: {
          target: 'declined',
          actions: assign({ declined: ({ event }) => `the refund could not be issued (${(event.error as { message?: string } | undefined)?.message ?? 'unknown error'})` }),
        },
      },
    },
    refunded: { type: 'final' },
    declined: { type: 'final' },
  },
  // The answer: its text, and the result as a data part (StatechartOutput).
  output: ({ context }) =>
    context.refund
      ? {
          text: `Refunded ${money(context.refund.amount)} (${context.reason}); refund ${context.refund.refundId}.`,
          data: { status: 'refunded', ...context.refund },
        }
      : {
          text: `No refund was issued: ${context.declined ?? 'it was declined'}.`,
          data: { status: 'declined', amount: context.amount, reason: context.reason, why: context.declined },
        },
});

export default machine;
