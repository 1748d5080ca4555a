import { assign, fromPromise, setup } from 'xstate';
import type { ReplyOutcome, ToolCall, TranscriptMessage } from '../src/providers/provider.js';
import { turnDigest } from './turn-digest.js';
import type { CompletionReason, TerminationReason } from './run.machine.js';

// The agent loop of one run, as an actor: checkpoint (lease and cancellation), input guardrails,
// model call, tool turn (or suspension for approval or input), answer guardrails, next round.
// The machine decides; the worker provides the actors that do I/O (machine.provide). A stage the
// agent has no guardrail for is passed without its invoke (`guarded`).

export type GuardrailOutcome =
  | { verdict: 'allow' }
  | { verdict: 'deny'; guardrail: string; reason: string }
  | { verdict: 'requireApproval'; guardrail: string; reason: string };

export type PendingApproval =
  | { kind: 'tools'; calls: ToolCall[]; digest: string }
  | { kind: 'guardrail'; stage: 'input' | 'answer'; guardrail: string; reason: string; answer: string | null; digest: string };

/** Input asked for by a tool (toolCallId set) or by the agent itself (toolCallId empty: a user turn). */
export type PendingInput = { toolCallId: string; toolName: string; prompt: string; schema: Record<string, unknown> };

/** How the final answer is shown to an A2A client. */
export type AnswerPresentation = 'artifact' | 'status_message' | 'direct_message';

export type ResumeInput =
  | { kind: 'approval'; approved: boolean; digest: string }
  | { kind: 'input'; value: unknown }
  | { kind: 'tool_result'; toolCallId: string; toolName: string; content: string };

export type LoopLimits = { maxIterations: number; tokenBudget: number | null };

/** Everything needed to continue the loop; a suspension stores it sealed. */
export type LoopState = {
  transcript: TranscriptMessage[];
  iteration: number;
  toolCallCount: number;
  inputTokens: number;
  outputTokens: number;
  providerIndex: number;
  inputChecked: boolean;
  lastText: string | null;
  /** How the last reply wants its answer shown (absent: as an artifact). */
  presentation?: AnswerPresentation;
  pendingApproval: PendingApproval | null;
  pendingInput: PendingInput | null;
  pendingDependency: { toolCallId: string; toolName: string; dependencyId: string } | null;
  resume: ResumeInput | null;
  /** What the creator recorded with the request (the A2A messageId), passed to providers. */
  requestMetadata?: Record<string, unknown>;
};

export type LoopOutcome =
  | { kind: 'complete'; reason: CompletionReason; answer: string | null; presentation?: AnswerPresentation }
  /** statusText: the failed task's status message, where the run has one to give (a statechart step's error, at the levels that keep it). */
  | { kind: 'fail'; reason: TerminationReason; detail: Record<string, unknown>; errorClass?: string; statusText?: string }
  /** dueAt: a statechart agent's timer that also runs while the run waits (docs/statechart-agents.md). */
  | { kind: 'suspend'; status: 'waiting_for_approval' | 'waiting_for_input' | 'waiting_for_dependency'; dueAt?: number }
  /** A statechart agent's durable timer: the run waits until dueAt. */
  | { kind: 'suspend'; status: 'waiting_for_timer'; dueAt: number }
  | { kind: 'stop'; why: 'lease_lost' | 'cancelled' };

/**
 * Which checks have a guardrail of the agent's to run: a stage without one is passed through
 * without invoking the check (an invoke costs a child actor and two transitions per run, and its
 * step would only answer allow, recording nothing).
 */
export type GuardedStages = { input: boolean; answer: boolean };

/** Every stage guarded: the loop invokes the check at both, and the step decides. */
export const ALL_STAGES_GUARDED: GuardedStages = Object.freeze({ input: true, answer: true });

export type LoopContext = LoopState & { limits: LoopLimits; guarded: GuardedStages; outcome: LoopOutcome | null };

/** The loop state of a request not yet worked on: its transcript, nothing counted or pending. */
export function freshLoopState(messages: TranscriptMessage[], requestMetadata?: Record<string, unknown>): LoopState {
  // The optional field goes last: an object literal that starts with a spread gets a hidden class
  // of its own on Node 20 (docs/decisions/0050-no-leading-spread-on-the-hot-path.md).
  return {
    transcript: messages,
    iteration: 0,
    toolCallCount: 0,
    inputTokens: 0,
    outputTokens: 0,
    providerIndex: 0,
    inputChecked: false,
    lastText: null,
    pendingApproval: null,
    pendingInput: null,
    pendingDependency: null,
    resume: null,
    ...(requestMetadata ? { requestMetadata } : {}),
  };
}

export type CheckpointResult = { alive: true } | { alive: false; why: 'lease_lost' | 'cancelled' };

export type ModelStepResult =
  | {
      kind: 'reply';
      text: string | null;
      toolCalls: ToolCall[];
      approvalRequired: boolean;
      providerIndex: number;
      inputTokens: number;
      outputTokens: number;
      outcome?: ReplyOutcome;
    }
  | { kind: 'failed'; reason: 'provider_failed' | 'not_retryable' | 'result_not_retainable'; errorClass: string; detail: Record<string, unknown> }
  | { kind: 'stop'; why: 'lease_lost' | 'cancelled' };

export type ToolStepResult =
  | { kind: 'done'; messages: TranscriptMessage[] }
  | { kind: 'input_required'; messages: TranscriptMessage[]; pending: PendingInput }
  | { kind: 'dependency'; messages: TranscriptMessage[]; pending: { toolCallId: string; toolName: string; dependencyId: string } }
  | { kind: 'stop'; why: 'lease_lost' | 'cancelled' };

const lastUserText = (transcript: readonly TranscriptMessage[]): string => {
  for (let index = transcript.length - 1; index >= 0; index -= 1) {
    const message = transcript[index]!;
    if (message.role === 'user') return message.content;
  }
  return '';
};

/** A guardrail's denial as the run's failure: the guardrail's name and configured reason, never the text. */
const guardrailDenial = (stage: 'input' | 'answer', verdict: GuardrailOutcome): LoopOutcome => ({
  kind: 'fail',
  reason: 'policy_denied',
  detail: { stage, guardrail: 'guardrail' in verdict ? verdict.guardrail : '', reason: 'reason' in verdict ? verdict.reason : '' },
});

/** A guardrail that asks a person: the turn waits for approval (its digest is set on suspension). */
const guardrailApproval = (stage: 'input' | 'answer', verdict: GuardrailOutcome, answer: string | null): PendingApproval => ({
  kind: 'guardrail',
  stage,
  guardrail: 'guardrail' in verdict ? verdict.guardrail : '',
  reason: 'reason' in verdict ? verdict.reason : '',
  answer,
  digest: '',
});

/** The run completes with its last reply as the answer, shown as the reply asked. */
const completedWithAnswer = (context: LoopContext): LoopOutcome => ({
  kind: 'complete',
  reason: 'completed',
  answer: context.lastText,
  presentation: context.presentation ?? 'artifact',
});

const deniedMessages = (calls: readonly ToolCall[]): TranscriptMessage[] =>
  calls.map((call) => ({ role: 'tool', toolCallId: call.id, name: call.name, content: `tool ${call.name} was denied by the operator` }));

export const agentLoopMachine = setup({
  types: {
    context: {} as LoopContext,
    input: {} as LoopContext,
    output: {} as LoopOutcome,
  },
  actors: {
    checkpoint: fromPromise<CheckpointResult, { context: LoopContext }>(async () => {
      throw new Error('checkpoint actor not provided');
    }),
    checkGuardrails: fromPromise<GuardrailOutcome, { stage: 'input' | 'answer'; text: string }>(async () => {
      throw new Error('checkGuardrails actor not provided');
    }),
    callModel: fromPromise<ModelStepResult, { context: LoopContext }>(async () => {
      throw new Error('callModel actor not provided');
    }),
    runTools: fromPromise<ToolStepResult, { context: LoopContext; calls: ToolCall[] }>(async () => {
      throw new Error('runTools actor not provided');
    }),
  },
  guards: {
    resumingApproval: ({ context }) => context.resume?.kind === 'approval' && context.pendingApproval !== null,
    resumingInput: ({ context }) => (context.resume?.kind === 'input' && context.pendingInput !== null) || context.resume?.kind === 'tool_result',
    inputUnchecked: ({ context }) => !context.inputChecked,
    inputUncheckedUnguarded: ({ context }) => !context.inputChecked && !context.guarded.input,
    answerUnguarded: ({ context }) => !context.guarded.answer,
    iterationsExhausted: ({ context }) => context.iteration >= context.limits.maxIterations,
    budgetExhausted: ({ context }) =>
      context.limits.tokenBudget !== null && context.inputTokens + context.outputTokens >= context.limits.tokenBudget,
  },
}).createMachine({
  id: 'agentLoop',
  context: ({ input }) => input,
  initial: 'checkpoint',
  states: {
    checkpoint: {
      invoke: {
        src: 'checkpoint',
        input: ({ context }) => ({ context }),
        onDone: [
          {
            guard: ({ event }) => !event.output.alive,
            target: 'done',
            actions: assign({ outcome: ({ event }) => ({ kind: 'stop', why: event.output.alive ? 'lease_lost' : event.output.why }) }),
          },
          { target: 'route' },
        ],
      },
    },
    route: {
      always: [
        { guard: 'resumingApproval', target: 'applyingApproval' },
        { guard: 'resumingInput', target: 'applyingInput' },
        // No input guardrail: the input counts as checked (as an allow would), and the route goes on.
        { guard: 'inputUncheckedUnguarded', actions: assign({ inputChecked: true }) },
        { guard: 'inputUnchecked', target: 'checkingInput' },
        {
          guard: 'iterationsExhausted',
          target: 'done',
          actions: assign({ outcome: ({ context }) => ({ kind: 'complete', reason: 'max_iterations', answer: context.lastText }) }),
        },
        {
          guard: 'budgetExhausted',
          target: 'done',
          actions: assign({ outcome: ({ context }) => ({ kind: 'complete', reason: 'budget_exhausted', answer: context.lastText }) }),
        },
        { target: 'callingModel' },
      ],
    },
    applyingApproval: {
      always: [
        {
          guard: ({ context }) => context.pendingApproval?.kind === 'tools' && context.resume?.kind === 'approval' && context.resume.approved,
          target: 'runningTools',
          actions: assign({ resume: null }),
        },
        {
          guard: ({ context }) => context.pendingApproval?.kind === 'tools',
          target: 'checkpoint',
          actions: assign({
            transcript: ({ context }) => [
              ...context.transcript,
              ...deniedMessages(context.pendingApproval?.kind === 'tools' ? context.pendingApproval.calls : []),
            ],
            pendingApproval: null,
            resume: null,
          }),
        },
        {
          guard: ({ context }) => context.resume?.kind === 'approval' && context.resume.approved && context.pendingApproval?.kind === 'guardrail' && context.pendingApproval.stage === 'input',
          target: 'route',
          actions: assign({ inputChecked: true, pendingApproval: null, resume: null }),
        },
        {
          guard: ({ context }) => context.resume?.kind === 'approval' && context.resume.approved,
          target: 'done',
          actions: assign({
            outcome: ({ context }) => ({
              kind: 'complete',
              reason: 'completed',
              answer: context.pendingApproval?.kind === 'guardrail' ? context.pendingApproval.answer : context.lastText,
              presentation: context.presentation ?? 'artifact',
            }),
          }),
        },
        {
          target: 'done',
          actions: assign({
            outcome: ({ context }) => ({
              kind: 'fail',
              reason: 'approval_denied',
              detail: context.pendingApproval?.kind === 'guardrail'
                ? { guardrail: context.pendingApproval.guardrail, stage: context.pendingApproval.stage, decision: 'denied' }
                : { decision: 'denied' },
            }),
          }),
        },
      ],
    },
    applyingInput: {
      always: {
        target: 'checkpoint',
        actions: assign({
          transcript: ({ context }) => {
            const resume = context.resume;
            if (resume?.kind === 'tool_result') {
              return [...context.transcript, { role: 'tool' as const, toolCallId: resume.toolCallId, name: resume.toolName, content: resume.content }];
            }
            const pending = context.pendingInput!;
            const value = resume?.kind === 'input' ? resume.value : null;
            if (pending.toolCallId === '') {
              return [...context.transcript, { role: 'user' as const, content: typeof value === 'string' ? value : JSON.stringify(value) }];
            }
            return [...context.transcript, { role: 'tool' as const, toolCallId: pending.toolCallId, name: pending.toolName, content: JSON.stringify(value) }];
          },
          pendingInput: null,
          pendingDependency: null,
          resume: null,
        }),
      },
    },
    checkingInput: {
      invoke: {
        src: 'checkGuardrails',
        input: ({ context }) => ({ stage: 'input' as const, text: lastUserText(context.transcript) }),
        onDone: [
          { guard: ({ event }) => event.output.verdict === 'allow', target: 'route', actions: assign({ inputChecked: true }) },
          {
            guard: ({ event }) => event.output.verdict === 'deny',
            target: 'done',
            actions: assign({ outcome: ({ event }) => guardrailDenial('input', event.output) }),
          },
          {
            target: 'suspendingForApproval',
            actions: assign({ pendingApproval: ({ event }) => guardrailApproval('input', event.output, null) }),
          },
        ],
      },
    },
    callingModel: {
      invoke: {
        src: 'callModel',
        input: ({ context }) => ({ context }),
        onDone: [
          {
            guard: ({ event }) => event.output.kind === 'stop',
            target: 'done',
            actions: assign({ outcome: ({ event }) => ({ kind: 'stop', why: event.output.kind === 'stop' ? event.output.why : 'lease_lost' }) }),
          },
          {
            guard: ({ event }) => event.output.kind === 'failed',
            target: 'done',
            actions: assign({
              outcome: ({ event }) =>
                event.output.kind === 'failed'
                  ? { kind: 'fail', reason: event.output.reason, detail: event.output.detail, errorClass: event.output.errorClass }
                  : null,
            }),
          },
          {
            guard: ({ event }) => event.output.kind === 'reply' && event.output.outcome?.kind === 'reject',
            target: 'done',
            actions: assign(({ context, event }) => {
              const reply = event.output as Extract<ModelStepResult, { kind: 'reply' }>;
              const outcome = reply.outcome as Extract<ReplyOutcome, { kind: 'reject' }>;
              return {
                iteration: context.iteration + 1,
                inputTokens: context.inputTokens + reply.inputTokens,
                outputTokens: context.outputTokens + reply.outputTokens,
                outcome: { kind: 'fail' as const, reason: 'policy_denied' as const, detail: { rejected: true, reason: outcome.reason } },
              };
            }),
          },
          {
            guard: ({ event }) => event.output.kind === 'reply' && event.output.outcome?.kind === 'input_required',
            target: 'done',
            actions: assign(({ context, event }) => {
              const reply = event.output as Extract<ModelStepResult, { kind: 'reply' }>;
              const outcome = reply.outcome as Extract<ReplyOutcome, { kind: 'input_required' }>;
              return {
                iteration: context.iteration + 1,
                inputTokens: context.inputTokens + reply.inputTokens,
                outputTokens: context.outputTokens + reply.outputTokens,
                providerIndex: reply.providerIndex,
                transcript: [...context.transcript, { role: 'assistant' as const, content: outcome.prompt }],
                pendingInput: { toolCallId: '', toolName: '', prompt: outcome.prompt, schema: {} },
                outcome: { kind: 'suspend' as const, status: 'waiting_for_input' as const },
              };
            }),
          },
          {
            guard: ({ event }) => event.output.kind === 'reply' && event.output.toolCalls.length > 0,
            target: 'toolTurn',
            actions: assign(({ context, event }) => {
              const reply = event.output as Extract<ModelStepResult, { kind: 'reply' }>;
              return {
                iteration: context.iteration + 1,
                inputTokens: context.inputTokens + reply.inputTokens,
                outputTokens: context.outputTokens + reply.outputTokens,
                providerIndex: reply.providerIndex,
                lastText: reply.text ?? context.lastText,
                transcript: [...context.transcript, { role: 'assistant' as const, content: reply.text, toolCalls: reply.toolCalls }],
                pendingApproval: reply.approvalRequired ? { kind: 'tools' as const, calls: reply.toolCalls, digest: '' } : null,
              };
            }),
          },
          {
            target: 'answered',
            actions: assign(({ context, event }) => {
              const reply = event.output as Extract<ModelStepResult, { kind: 'reply' }>;
              const presented = reply.outcome?.kind === 'status_message' || reply.outcome?.kind === 'direct_message' ? reply.outcome : null;
              const text = presented ? presented.text : reply.text;
              return {
                iteration: context.iteration + 1,
                inputTokens: context.inputTokens + reply.inputTokens,
                outputTokens: context.outputTokens + reply.outputTokens,
                providerIndex: reply.providerIndex,
                lastText: text,
                presentation: presented ? presented.kind : ('artifact' as const),
                transcript: [...context.transcript, { role: 'assistant' as const, content: text }],
              };
            }),
          },
        ],
      },
    },
    toolTurn: {
      always: [
        { guard: ({ context }) => context.pendingApproval !== null, target: 'suspendingForApproval' },
        { target: 'runningTools' },
      ],
    },
    runningTools: {
      invoke: {
        src: 'runTools',
        input: ({ context }) => {
          const assistant = context.transcript[context.transcript.length - 1];
          const calls = context.pendingApproval?.kind === 'tools' ? context.pendingApproval.calls : assistant?.role === 'assistant' ? (assistant.toolCalls ?? []) : [];
          return { context, calls };
        },
        onDone: [
          {
            guard: ({ event }) => event.output.kind === 'stop',
            target: 'done',
            actions: assign({ outcome: ({ event }) => ({ kind: 'stop', why: event.output.kind === 'stop' ? event.output.why : 'lease_lost' }) }),
          },
          {
            guard: ({ event }) => event.output.kind === 'input_required',
            target: 'done',
            actions: assign(({ context, event }) => {
              const output = event.output as Extract<ToolStepResult, { kind: 'input_required' }>;
              return {
                transcript: [...context.transcript, ...output.messages],
                toolCallCount: context.toolCallCount + output.messages.length + 1,
                pendingApproval: null,
                pendingInput: output.pending,
                outcome: { kind: 'suspend' as const, status: 'waiting_for_input' as const },
              };
            }),
          },
          {
            guard: ({ event }) => event.output.kind === 'dependency',
            target: 'done',
            actions: assign(({ context, event }) => {
              const output = event.output as Extract<ToolStepResult, { kind: 'dependency' }>;
              return {
                transcript: [...context.transcript, ...output.messages],
                toolCallCount: context.toolCallCount + output.messages.length + 1,
                pendingApproval: null,
                pendingDependency: output.pending,
                outcome: { kind: 'suspend' as const, status: 'waiting_for_dependency' as const },
              };
            }),
          },
          {
            target: 'checkpoint',
            actions: assign(({ context, event }) => {
              const output = event.output as Extract<ToolStepResult, { kind: 'done' }>;
              return {
                transcript: [...context.transcript, ...output.messages],
                toolCallCount: context.toolCallCount + output.messages.length,
                pendingApproval: null,
              };
            }),
          },
        ],
      },
    },
    answered: {
      always: [
        // No answer guardrail: the answer is the outcome, as an allow would make it.
        { guard: 'answerUnguarded', target: 'done', actions: assign({ outcome: ({ context }) => completedWithAnswer(context) }) },
        { target: 'checkingAnswer' },
      ],
    },
    checkingAnswer: {
      invoke: {
        src: 'checkGuardrails',
        input: ({ context }) => ({ stage: 'answer' as const, text: context.lastText ?? '' }),
        onDone: [
          {
            guard: ({ event }) => event.output.verdict === 'allow',
            target: 'done',
            actions: assign({ outcome: ({ context }) => completedWithAnswer(context) }),
          },
          {
            guard: ({ event }) => event.output.verdict === 'deny',
            target: 'done',
            actions: assign({ outcome: ({ event }) => guardrailDenial('answer', event.output) }),
          },
          {
            target: 'suspendingForApproval',
            actions: assign({ pendingApproval: ({ context, event }) => guardrailApproval('answer', event.output, context.lastText) }),
          },
        ],
      },
    },
    suspendingForApproval: {
      // The digest binds an operator's decision to exactly what was pending when it was shown.
      always: {
        target: 'done',
        actions: assign({
          pendingApproval: ({ context }) =>
            context.pendingApproval ? { ...context.pendingApproval, digest: turnDigest({ ...context.pendingApproval, digest: undefined }) } : null,
          outcome: { kind: 'suspend', status: 'waiting_for_approval' },
        }),
      },
    },
    done: { type: 'final' },
  },
  output: ({ context }: { context: LoopContext }): LoopOutcome => context.outcome ?? { kind: 'stop', why: 'lease_lost' },
});
