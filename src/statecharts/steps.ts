import { fromPromise, type PromiseActorLogic } from 'xstate';
import type { KeelLogger } from '../log/logger.js';
import type { GuardedFetch } from '../net/guarded-fetch.js';
import type { TranscriptMessage } from '../providers/provider.js';
import type { ToolEffect } from '../tools/tool.js';

// What a statechart agent's machine invokes (docs/statechart-agents.md). Each export is XState
// actor logic to name in the machine's setup({ actors }); Keel runs it as a durable step of the
// run: its effect decides what a crash in flight does, and its output is committed with the
// transition it causes before the machine goes on. Outside Keel (a unit test of the machine with
// createActor) the built-in steps reject, so a test provides its own with machine.provide().

/** A step's effect, as a tool's: a read or an idempotent write is run again after a crash; a non-idempotent write dead-letters the run. */
export type StepEffect = ToolEffect;

/** How a step waits: at once (it runs and answers) or by suspending the run until someone answers. */
export type StepKind = 'callModel' | 'callTool' | 'askInput' | 'askApproval' | 'callRemoteAgent' | 'custom';

export const KEEL_STEP = Symbol.for('keel.statechart.step');

/** What a custom step is given besides its input. */
export type StepContext = {
  runId: string;
  agentId: string;
  /** The step's durable key: the same on a re-run after a crash (an idempotency key for a write). */
  stepKey: string;
  fetch: GuardedFetch;
  signal: AbortSignal;
  logger: KeelLogger;
};

export type StepMarker = {
  kind: StepKind;
  /** For a custom step; a tool call's effect is the tool's own. */
  effect?: StepEffect;
  run?: (input: never, context: StepContext) => Promise<unknown>;
};

// Typed as plain promise logic (the marker is read at run time), so a unit test may put a
// fromPromise stand-in in its place with machine.provide({ actors }).
function keelStep<TOutput, TInput>(marker: StepMarker): PromiseActorLogic<TOutput, TInput> {
  const logic = fromPromise<TOutput, TInput>(async () => {
    throw new Error(`the Keel step ${marker.kind} runs only inside a Keel run; in a unit test, provide the actor with machine.provide({ actors })`);
  });
  return Object.assign(logic, { [KEEL_STEP]: marker });
}

/** The marker of a Keel step, or null for logic that is not one. */
export function stepMarkerOf(logic: unknown): StepMarker | null {
  if ((typeof logic !== 'object' && typeof logic !== 'function') || logic === null) return null;
  const marker = (logic as { [KEEL_STEP]?: StepMarker })[KEEL_STEP];
  return marker ?? null;
}

export type CallModelInput = {
  /** A user turn appended to the conversation (the task's messages, unless `messages` replaces them). */
  prompt?: string;
  /** The whole conversation to send instead of the task's. */
  messages?: TranscriptMessage[];
  /** A system message put first. */
  system?: string;
};
/** The model's reply: its text, and that text parsed when it is JSON (a classifier's answer). */
export type CallModelOutput = { text: string | null; data?: unknown };

/** The agent's provider chain (retries, fallbacks, privacy ceilings, token budget): a read. */
export const callModel = keelStep<CallModelOutput, CallModelInput>({ kind: 'callModel', effect: 'read_only' });

export type CallToolInput = { tool: string; arguments?: Record<string, unknown> };
/** One of the agent's tools (listed under its `tools`), with the effect the tool declares; its content is the output, its error the step's error. */
export const callTool = keelStep<unknown, CallToolInput>({ kind: 'callTool' });

export type AskInputInput = { prompt: string; schema?: Record<string, unknown> };
/**
 * The task goes INPUT_REQUIRED with the prompt; the client's next message resumes the machine. The
 * output is the reply's data part if it has one, else its text.
 */
export const askInput = keelStep<unknown, AskInputInput>({ kind: 'askInput', effect: 'read_only' });

export type AskApprovalInput = { summary: string; details?: Record<string, unknown> };
export type AskApprovalOutput = { approved: boolean };
/** The run waits for an operator's approval (`keel runs approve|deny`, the operator UI); the output says which. */
export const askApproval = keelStep<AskApprovalOutput, AskApprovalInput>({ kind: 'askApproval', effect: 'read_only' });

export type CallRemoteAgentInput = { agent: string; message: string };
export type CallRemoteAgentOutput = { state: string; result?: unknown; [key: string]: unknown };
/**
 * A task of a remote agent (remoteAgents in the config; the agent lists the `remote_agent` tool):
 * the run waits for it, the output is its outcome. Sent again after a crash, it is the same message
 * (its id is bound to the step's key), so the remote agent sees one task.
 */
export const callRemoteAgent = keelStep<CallRemoteAgentOutput, CallRemoteAgentInput>({ kind: 'callRemoteAgent', effect: 'idempotent_write' });

/**
 * A step of the agent's own: `run` does the work (an HTTP call, a database write) and declares its
 * effect. Its output must be JSON (it is committed with the machine's snapshot).
 */
export function defineStep<TInput, TOutput>(definition: { effect: StepEffect; run: (input: TInput, context: StepContext) => Promise<TOutput> }): PromiseActorLogic<TOutput, TInput> {
  return keelStep<TOutput, TInput>({ kind: 'custom', effect: definition.effect, run: definition.run as StepMarker['run'] });
}

/**
 * What a machine's final state outputs. A string is the answer's text; an object may hold the text,
 * data (a data part of the answer) and named artifacts, each with text, data or parts.
 */
export type StatechartOutput =
  | string
  | {
      text?: string;
      data?: unknown;
      artifacts?: { name: string; description?: string; text?: string; data?: unknown }[];
    };
