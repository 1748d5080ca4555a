import type { DatabasePool } from 'slonik';
import type { LoopOutcome, LoopState, PendingApproval, PendingInput } from '../machines/agent-loop.machine.js';
import { REASONS_BY_TERMINAL_STATUS, type CompletionReason, type TerminationReason } from '../machines/run.machine.js';
import { turnDigest } from '../machines/turn-digest.js';
import type { RegisteredAgent } from '../src/agents/agent-registry.js';
import type { KeelLogger } from '../src/log/logger.js';
import type { GuardedFetch } from '../src/net/guarded-fetch.js';
import type { ArtifactEmission, ToolCall, TranscriptMessage } from '../src/providers/provider.js';
import type { AuditTrail } from '../src/runs/audit-trail.js';
import type { ChainAnswer, ProviderChain } from '../src/runs/provider-chain.js';
import { artifactTooLargeDetail, oversizedArtifact, type OversizedArtifact } from '../src/runs/artifact-limit.js';
import { appendRunOutputs, outputFromEmission, type NewRunOutput } from '../src/runs/run-output-repository.js';
import { announceRunOutputs, appendMachineStep, lockHeldRun, markNonIdempotentCall, saveMachineProgress, type Holder } from '../src/runs/run-repository.js';
import type { LateWriteFence } from '../src/runs/late-write-fence.js';
import type { Sealer } from '../src/sealing/sealer.js';
import type { StatechartDefinition } from '../src/statecharts/statechart-definition.js';
import {
  resultOfOutput,
  runStatechart,
  type MachineRecord,
  type RunningStep,
  type StatechartHost,
  type StepOutcome,
} from '../src/statecharts/statechart-run.js';
import { errorClassOf, errorTextNotKept, errorTextSetting, stepFailureText } from '../src/statecharts/step-failure.js';
import type { AskApprovalInput, AskInputInput, CallModelInput, CallRemoteAgentInput, CallToolInput, StepMarker } from '../src/statecharts/steps.js';
import type { ToolEffect, ToolResult } from '../src/tools/tool.js';
import { started, unlessCancelled, type DiscardLate, type LateOutcome } from '../src/runs/unless-cancelled.js';
import type { RunningStepName } from './run-execution.js';
import { StatechartTrace } from '../src/tracing/statechart-trace.js';
import { tracingEnabled } from '../src/tracing/tracing-switch.js';

// A statechart agent's run inside the runs worker (docs/statechart-agents.md): the machine decides
// (src/statecharts/statechart-run.ts), this host does the I/O of each step and commits each
// transition under the run's lease. What it returns is an outcome of the same kind as the agent
// loop's, so the executor settles, suspends or stops it the same way.

/** A step the run started, by key: what it runs and its effect, so a retry knows which steps it must not run again. */
export type StartedStep = { id: string; src: string; effect: ToolEffect };

/** What a statechart run keeps in its durable state besides the agent loop's fields (whose pending* fields the resume paths read). */
export type StatechartState = LoopState & {
  machine?: MachineRecord | null;
  waiting?: RunningStep | null;
  /** Every step started so far, by key (recorded with the transition that started it). */
  startedSteps?: Record<string, StartedStep>;
};

/** What the machine is given as input: the task's message. */
export type StatechartInput = {
  text: string;
  /** The first data part of the message, if any. */
  data?: unknown;
  /** The message's parts; files as references (url, name, media type), never their bytes. */
  parts: unknown[];
  /** The earlier turns of the context (user and agent messages). */
  history: { role: 'user' | 'assistant'; content: string }[];
  taskId: string | null;
  contextId: string | null;
  messageId: string | null;
};

export type StatechartRunDeps = {
  pool: DatabasePool;
  sealer: Sealer;
  runId: string;
  taskId: string | null;
  /** The claim the run is held under: every write carries it (decision 0088). */
  holder: Holder;
  /** Told of a write the fence refused (the run's claim changed). */
  fence: LateWriteFence;
  agent: RegisteredAgent;
  definition: StatechartDefinition;
  state: StatechartState;
  audit: AuditTrail;
  logger: KeelLogger;
  fetch: GuardedFetch;
  /** Aborted when the run stops (cancelled, lease lost, released): every step's signal follows it. */
  signal: AbortSignal;
  /** Aborted only when the run was cancelled: a custom step still running is no longer waited for. */
  cancelled: AbortSignal;
  /** Takes what a step answers after the run was cancelled: recorded as discarded, never applied. */
  discard: DiscardLate;
  /** Told which step the run waits for (null once it answered), for a cancel's timeline event. */
  current: (step: RunningStepName | null) => void;
  providerChain: ProviderChain;
  checkpoint: () => Promise<{ alive: true } | { alive: false; why: 'lease_lost' | 'cancelled' }>;
  runTool: (call: ToolCall) => Promise<ToolResult | 'stop'>;
  /** After a commit that showed something (the projector journals it). */
  shown: () => void;
  /** a2a.maxArtifactBytes: the largest artifact the machine may show or output. */
  maxArtifactBytes: number;
};

export type StatechartRunResult = { outcome: LoopOutcome; state: StatechartState; artifacts: ArtifactEmission[] };

/** The step failed in a way that ends the run with a reason (the provider chain gave up, the budget ran out). */
type StepFailure = { kind: 'fail'; reason: TerminationReason; detail: Record<string, unknown>; errorClass?: string };

/** The machine's input from the run's request (the last user message, with the parts the A2A layer recorded). */
export function statechartInputOf(state: LoopState): StatechartInput {
  const metadata = state.requestMetadata ?? {};
  const conversation = state.transcript.filter((message): message is Extract<TranscriptMessage, { role: 'user' | 'assistant' }> => message.role === 'user' || message.role === 'assistant');
  const last = conversation.at(-1);
  const parts = Array.isArray(metadata.parts) ? (metadata.parts as unknown[]) : [{ text: last?.content ?? '' }];
  const data = parts.find((part): part is { data: unknown } => typeof part === 'object' && part !== null && 'data' in part);
  return {
    text: last?.role === 'user' ? (last.content ?? '') : '',
    ...(data ? { data: data.data } : {}),
    parts,
    history: conversation.slice(0, -1).map((message) => ({ role: message.role, content: message.content ?? '' })),
    taskId: typeof metadata.taskId === 'string' ? metadata.taskId : null,
    contextId: typeof metadata.contextId === 'string' ? metadata.contextId : null,
    messageId: typeof metadata.messageId === 'string' ? metadata.messageId : null,
  };
}

type Answer = { stepId: string; output: unknown; error?: unknown };

/**
 * What a resumed run brings to the step it waited for: the reply, the decision or the remote
 * outcome as its answer; or, for a tool call that waited for its approval, the call to run now
 * (approved; the step is still in the record) or an error (denied).
 */
function resumeOf(state: StatechartState, agent: RegisteredAgent): { answer: Answer | null; approvedCall: string | null } {
  const waiting = state.waiting;
  const resume = state.resume;
  if (!waiting || !resume) return { answer: null, approvedCall: null };
  switch (resume.kind) {
    case 'input':
      return { answer: { stepId: waiting.id, output: resume.value }, approvedCall: null };
    case 'approval': {
      const toolCall = state.pendingApproval?.kind === 'tools' && state.pendingApproval.calls.some((call) => call.id === waiting.key && agent.tools.get(call.name)?.needsApproval === true);
      if (!toolCall) return { answer: { stepId: waiting.id, output: { approved: resume.approved } }, approvedCall: null };
      if (resume.approved) return { answer: null, approvedCall: waiting.key };
      return { answer: { stepId: waiting.id, output: null, error: { message: 'an operator did not approve the call', reason: 'approval_denied' } }, approvedCall: null };
    }
    case 'tool_result': {
      // The remote outcome as JSON, or as text when it is not.
      const parsed = tryJson(resume.content);
      return { answer: { stepId: waiting.id, output: parsed === undefined ? resume.content : parsed }, approvedCall: null };
    }
  }
}

const tryJson = (text: string | null): unknown => {
  if (text === null) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
};

export async function runStatechartAgent(deps: StatechartRunDeps): Promise<StatechartRunResult> {
  const { pool, sealer, runId, holder, agent, definition, audit } = deps;
  let state: StatechartState = { ...deps.state };
  const failures = new Map<string, StepFailure>();
  /** Non-idempotent steps started in this process whose outcome no commit has taken yet. */
  const unsettledWrites = new Set<string>();
  let modelCalls = state.iteration;

  const toolOutcome = (result: ToolResult | 'stop', step: RunningStep, name: string): StepOutcome => {
    if (result === 'stop') return { kind: 'stop', why: deps.cancelled.aborted ? 'cancelled' : 'lease_lost' };
    switch (result.kind) {
      case 'ok':
        return { kind: 'done', output: result.content };
      case 'error':
        return { kind: 'error', error: { message: result.message } };
      case 'input_required': {
        const pending: PendingInput = { toolCallId: step.key, toolName: name, prompt: result.prompt, schema: result.schema };
        return { kind: 'wait', status: 'waiting_for_input', pending };
      }
      case 'dependency':
        return { kind: 'wait', status: 'waiting_for_dependency', pending: { toolCallId: step.key, toolName: name, dependencyId: result.dependencyId } };
    }
  };

  const chainFailure = (answer: Exclude<ChainAnswer, { kind: 'reply' }>): StepOutcome => {
    if (answer.kind === 'stop') return { kind: 'stop', why: answer.why };
    return { kind: 'error', error: { message: `the model call failed (${answer.reason})`, reason: answer.reason, failure: answer } };
  };

  async function perform(step: RunningStep, marker: StepMarker, signal: AbortSignal): Promise<StepOutcome> {
    switch (marker.kind) {
      case 'callModel': {
        const input = (step.input ?? {}) as CallModelInput;
        if (modelCalls >= agent.config.limits.maxIterations) {
          failures.set(step.id, { kind: 'fail', reason: 'max_iterations', detail: { step: step.src, maxIterations: agent.config.limits.maxIterations } });
          return { kind: 'error', error: { message: `the agent's model calls are spent (limits.maxIterations ${agent.config.limits.maxIterations})`, reason: 'max_iterations' } };
        }
        const budget = agent.config.limits.tokenBudget;
        if (budget !== undefined && state.inputTokens + state.outputTokens >= budget) {
          failures.set(step.id, { kind: 'fail', reason: 'budget_exhausted', detail: { step: step.src } });
          return { kind: 'error', error: { message: 'the token budget is spent', reason: 'budget_exhausted' } };
        }
        const system: TranscriptMessage[] = input.system ? [{ role: 'system', content: input.system }] : agent.config.systemPrompt ? [{ role: 'system', content: agent.config.systemPrompt }] : [];
        const conversation = input.messages ?? state.transcript.filter((message) => message.role !== 'system');
        const transcript = [...system, ...conversation, ...(input.prompt ? [{ role: 'user' as const, content: input.prompt }] : [])];
        const answer = await deps.providerChain.call({ iteration: modelCalls, transcript, providerIndex: state.providerIndex, ...(state.requestMetadata ? { requestMetadata: state.requestMetadata } : {}) });
        modelCalls += 1;
        if (answer.kind !== 'reply') {
          if (answer.kind === 'failed') failures.set(step.id, { kind: 'fail', reason: answer.reason, detail: answer.detail, ...(answer.errorClass ? { errorClass: answer.errorClass } : {}) });
          return chainFailure(answer);
        }
        state = {
          ...state,
          iteration: modelCalls,
          providerIndex: answer.providerIndex,
          inputTokens: state.inputTokens + answer.reply.usage.inputTokens,
          outputTokens: state.outputTokens + answer.reply.usage.outputTokens,
        };
        const text = answer.reply.text;
        const data = tryJson(text);
        return { kind: 'done', output: { text, ...(data === undefined ? {} : { data }) } };
      }
      case 'callTool': {
        const input = (step.input ?? {}) as CallToolInput;
        if (typeof input.tool !== 'string' || !agent.tools.has(input.tool)) {
          return { kind: 'error', error: { message: `tool ${String(input.tool)} is not one of the agent's tools (${[...agent.tools.keys()].join(', ') || 'none'})` } };
        }
        const call: ToolCall = { id: step.key, name: input.tool, arguments: input.arguments ?? {} };
        if (agent.tools.get(input.tool)!.needsApproval && !approvedCalls.has(step.key)) {
          // A tool that needs approval waits for an operator's decision on exactly this call; approved, the step runs it.
          const pending: PendingApproval = { kind: 'tools', calls: [call], digest: '' };
          return { kind: 'wait', status: 'waiting_for_approval', pending: { ...pending, digest: turnDigest({ ...pending, digest: undefined }) } };
        }
        state = { ...state, toolCallCount: state.toolCallCount + 1 };
        const result = await deps.runTool(call);
        return toolOutcome(result, step, input.tool);
      }
      case 'callRemoteAgent': {
        const input = (step.input ?? {}) as CallRemoteAgentInput;
        if (!agent.tools.has('remote_agent')) return { kind: 'error', error: { message: 'callRemoteAgent needs the remote_agent tool in the agent\'s tools' } };
        state = { ...state, toolCallCount: state.toolCallCount + 1 };
        const result = await deps.runTool({ id: step.key, name: 'remote_agent', arguments: { agent: input.agent, message: input.message } });
        return toolOutcome(result, step, 'remote_agent');
      }
      case 'askInput': {
        const input = (step.input ?? {}) as AskInputInput;
        if (typeof input.prompt !== 'string' || input.prompt === '') return { kind: 'error', error: { message: 'askInput needs a prompt' } };
        const pending: PendingInput = { toolCallId: step.key, toolName: 'askInput', prompt: input.prompt, schema: input.schema ?? {} };
        return { kind: 'wait', status: 'waiting_for_input', pending };
      }
      case 'askApproval': {
        const input = (step.input ?? {}) as AskApprovalInput;
        const calls: ToolCall[] = [{ id: step.key, name: 'askApproval', arguments: { summary: input.summary ?? '', ...(input.details ?? {}) } }];
        const pending: PendingApproval = { kind: 'tools', calls, digest: '' };
        return { kind: 'wait', status: 'waiting_for_approval', pending: { ...pending, digest: turnDigest({ ...pending, digest: undefined }) } };
      }
      case 'custom': {
        const effect = marker.effect ?? 'non_idempotent_write';
        // A step of the agent's own counts as a tool call in the run's totals.
        state = { ...state, toolCallCount: state.toolCallCount + 1 };
        const event = { kind: 'tool_call', meta: { tool: `step:${step.src}`, effect, callId: step.key }, content: { arguments: step.input } };
        if (effect !== 'read_only') {
          if (!(await audit.recordNow(pool, event))) return { kind: 'error', error: { message: `step ${step.src} was not run: its audit record could not be stored` } };
        } else {
          audit.record(event);
        }
        if (effect === 'non_idempotent_write') {
          unsettledWrites.add(step.key);
          if (!(await markNonIdempotentCall(pool, runId, holder, step.key))) {
            deps.fence.refuse('non_idempotent_mark');
            return { kind: 'stop', why: 'lease_lost' };
          }
        }
        const startedAt = Date.now();
        // The step's signal aborts when the machine leaves its state or the run stops (a cancel
        // included); a cancel also stops the wait for a step that ignores it (decision 0066).
        const stepSignal = AbortSignal.any([signal, deps.signal]);
        const running = started(() => marker.run!(step.input as never, { runId, agentId: agent.config.id, stepKey: step.key, fetch: deps.fetch, signal: stepSignal, logger: deps.logger }));
        deps.current({ step: 'step', name: step.src, callId: step.key });
        try {
          const raced = await unlessCancelled(running, deps.cancelled);
          if (!raced.done) {
            deps.discard(
              running.then(
                (): LateOutcome => ({ outcome: 'ok' }),
                (): LateOutcome => ({ outcome: 'error' }),
              ),
              { step: 'step', tool: `step:${step.src}`, callId: step.key },
            );
            return { kind: 'stop', why: 'cancelled' };
          }
          const output = raced.value;
          audit.record({ kind: 'tool_result', meta: { tool: `step:${step.src}`, callId: step.key, outcome: 'ok', durationMs: Date.now() - startedAt }, content: { result: output } });
          return { kind: 'done', output: output === undefined ? null : JSON.parse(JSON.stringify(output)) };
        } catch (error) {
          // The class goes with the message: the machine (event.error.name) and the run's record show it.
          const thrown = { message: error instanceof Error ? error.message : String(error), name: errorClassOf(error) };
          audit.record({ kind: 'tool_result', meta: { tool: `step:${step.src}`, callId: step.key, outcome: 'error', errorClass: thrown.name, durationMs: Date.now() - startedAt }, content: { error: thrown.message } });
          return { kind: 'error', error: thrown };
        } finally {
          deps.current(null);
        }
      }
    }
  }

  /** A step's effect: a custom step's own (non-idempotent unless it says otherwise), a tool call's tool's, the built-in steps' fixed ones. */
  const effectOf = (step: RunningStep): ToolEffect => {
    const marker = definition.steps.get(step.src);
    if (!marker) return 'non_idempotent_write';
    if (marker.kind === 'callTool') {
      const tool = (step.input as CallToolInput | null)?.tool;
      return (typeof tool === 'string' ? agent.tools.get(tool)?.effect : undefined) ?? 'non_idempotent_write';
    }
    return marker.effect ?? 'non_idempotent_write';
  };


  // While tracing is on, the states and steps of this stretch (src/tracing/statechart-trace.ts).
  const traced = tracingEnabled() ? new StatechartTrace(runId) : null;
  const host: StatechartHost = {
    perform: (step, marker, signal) => (traced ? traced.step(step, () => perform(step, marker, signal)) : perform(step, marker, signal)),
    checkpoint: deps.checkpoint,
    cancelled: deps.cancelled,
    commit: async ({ record, value, event, shown }) => {
      // An artifact over a2a.maxArtifactBytes: nothing of the transition is written and the run fails (below).
      oversized ??= oversizedArtifact(shown.artifacts, null, deps.maxArtifactBytes);
      if (oversized) return false;
      const stillRunning = new Set(record.running.map((step) => step.key));
      for (const key of unsettledWrites) if (!stillRunning.has(key)) unsettledWrites.delete(key);
      const mark = unsettledWrites.values().next().value ?? null;
      const outputs: NewRunOutput[] = [
        ...shown.statuses.map((text): NewRunOutput => ({ kind: 'status', artifactId: null, append: false, lastChunk: false, content: { parts: [{ text }] } })),
        ...shown.artifacts.map((emission, index) => outputFromEmission('artifact', emission, `artifact-${record.transitions}-${index}`)),
      ];
      const committed = await pool.transaction(async (transaction) => {
        const held = await lockHeldRun(transaction, runId, holder);
        if (!held) return false;
        if (outputs.length > 0) {
          if (!(await announceRunOutputs(transaction, runId, holder))) return false;
          await appendRunOutputs(transaction, sealer, runId, held.revision + 1, held.answerLevel, outputs);
        }
        const startedSteps = { ...state.startedSteps };
        for (const step of record.running) startedSteps[step.key] ??= { id: step.id, src: step.src, effect: effectOf(step) };
        state = { ...state, machine: record, waiting: null, startedSteps };
        const saved = await saveMachineProgress(transaction, sealer, runId, holder, {
          state,
          // The version the run started with (each path row names the version that took it).
          machineHash: record.startedWith,
          machineState: value,
          insideNonIdempotentStep: mark,
        });
        if (!saved) return false;
        await appendMachineStep(transaction, runId, { sequence: record.transitions, state: value, event, machineHash: record.hash }, { sealer, state });
        return true;
      });
      if (committed && outputs.length > 0) deps.shown();
      if (!committed) deps.fence.refuse('progress');
      if (committed) traced?.entered(value);
      return committed;
    },
  };

  let oversized: OversizedArtifact | null = null;
  const { answer, approvedCall } = resumeOf(state, agent);
  /** Tool calls an operator approved: the resumed run performs them. */
  const approvedCalls = new Set<string>(approvedCall === null ? [] : [approvedCall]);
  const record = state.machine ?? null;
  let result: Awaited<ReturnType<typeof runStatechart>>;
  try {
    result = await runStatechart(definition, { record, input: statechartInputOf(state), answer }, host);
  } finally {
    traced?.left();
  }
  // The decision or reply is consumed: a later suspension stores its own.
  state = { ...state, resume: null, pendingApproval: null, pendingInput: null, pendingDependency: null };

  const tooLarge = (found: OversizedArtifact): StatechartRunResult => {
    audit.record({ kind: 'failed', meta: artifactTooLargeDetail(found) });
    return { outcome: { kind: 'fail', reason: 'not_retryable', detail: artifactTooLargeDetail(found), errorClass: 'artifact_too_large' }, state, artifacts: [] };
  };
  if (oversized) return tooLarge(oversized);
  switch (result.kind) {
    case 'complete': {
      const { answer: text, artifacts } = resultOfOutput(result.output);
      const outputTooLarge = oversizedArtifact(artifacts, text, deps.maxArtifactBytes);
      if (outputTooLarge) return tooLarge(outputTooLarge);
      return { outcome: { kind: 'complete', reason: 'completed', answer: text }, state: { ...state, machine: result.record }, artifacts };
    }
    case 'fail': {
      const failed = [...failures.values()][0];
      const error = result.error;
      if (error !== undefined) {
        // The message where the audit level keeps content, else the line naming the setting that
        // keeps it (step-failure.ts); the class, a name, always.
        const level = audit.currentLevel;
        const text = stepFailureText(level, error.step, error);
        const notKept = text === null ? errorTextNotKept(level, errorTextSetting(agent.config.id, agent.config.privacy?.auditLevel)) : null;
        audit.record({ kind: 'machine_error', meta: { ...result.detail, ...(notKept === null ? {} : { message: notKept }) }, ...(notKept === null ? { content: { message: error.message } } : {}) });
        if (!failed || result.detail.reason !== 'machine_error') {
          const detail = { ...result.detail, ...(notKept === null ? {} : { messageNotKept: notKept }) };
          return { outcome: { kind: 'fail', reason: 'not_retryable', detail, errorClass: error.errorClass, ...(text === null ? {} : { statusText: `the agent's machine stopped: ${text}` }) }, state, artifacts: [] };
        }
      }
      if (failed && result.detail.reason === 'machine_error') {
        if ((REASONS_BY_TERMINAL_STATUS.completed as readonly string[]).includes(failed.reason)) {
          return { outcome: { kind: 'complete', reason: failed.reason as CompletionReason, answer: null }, state, artifacts: [] };
        }
        return { outcome: { kind: 'fail', reason: failed.reason, detail: failed.detail, ...(failed.errorClass ? { errorClass: failed.errorClass } : {}) }, state, artifacts: [] };
      }
      return { outcome: { kind: 'fail', reason: 'not_retryable', detail: result.detail }, state, artifacts: [] };
    }
    case 'wait': {
      const waited: StatechartState = { ...state, machine: result.record, waiting: result.step };
      if (result.status === 'waiting_for_input') waited.pendingInput = result.pending as PendingInput;
      else if (result.status === 'waiting_for_approval') waited.pendingApproval = result.pending as PendingApproval;
      else waited.pendingDependency = result.pending as StatechartState['pendingDependency'];
      return { outcome: { kind: 'suspend', status: result.status, ...(result.dueAt === undefined ? {} : { dueAt: result.dueAt }) }, state: waited, artifacts: [] };
    }
    case 'sleep':
      return { outcome: { kind: 'suspend', status: 'waiting_for_timer', dueAt: result.dueAt }, state: { ...state, machine: result.record, waiting: null }, artifacts: [] };
    case 'stop':
      return { outcome: { kind: 'stop', why: result.why }, state, artifacts: [] };
  }
}
