import { Ajv, type ValidateFunction } from 'ajv';
import type {
  agentLoopMachine,
  CheckpointResult,
  GuardrailOutcome,
  LoopContext,
  LoopState,
  ModelStepResult,
  ToolStepResult,
} from '../machines/agent-loop.machine.js';
import type { MachineSteps, MachineStepper } from '../machines/step-machine.js';
import { evaluateGuardrails, guardedStagesOf } from '../src/guardrails/guardrail.js';
import type { GuardedFetch } from '../src/net/guarded-fetch.js';
import type { ToolCall, TranscriptMessage } from '../src/providers/provider.js';
import type { ProviderChain } from '../src/runs/provider-chain.js';
import { artifactTooLargeDetail, oversizedArtifact } from '../src/runs/artifact-limit.js';
import { appendRunOutputs, outputFromEmission } from '../src/runs/run-output-repository.js';
import { announceRunOutputs, lockHeldRun, markNonIdempotentCall } from '../src/runs/run-repository.js';
import type { Sealer } from '../src/sealing/sealer.js';
import type { ToolDefinition, ToolResult } from '../src/tools/tool.js';
import { inToolSpan } from '../src/tracing/gen-ai-spans.js';
import { tracingEnabled } from '../src/tracing/tracing-switch.js';
import { started, unlessCancelled, type DiscardLate, type LateOutcome } from '../src/runs/unless-cancelled.js';
import type { DatabasePool } from '../src/db/pool.js';
import type { AfterCommit, DrivenRun, RunInHand } from './run-execution.js';
import { runStatechartAgent } from './statechart-agent-run.js';

// A run's drive: the agent loop's steps (checkpoint, model call, tools, guardrails) as the worker
// carries them out for the run it holds, or a statechart agent's own machine. Every write is one
// of the run repository's guarded transitions; a worker that lost its lease writes nothing.

const TOOL_RESULT_LIMIT = 64 * 1024;

function toolContent(result: unknown): string {
  const text = typeof result === 'string' ? result : (JSON.stringify(result) ?? 'null');
  return text.length > TOOL_RESULT_LIMIT ? `${text.slice(0, TOOL_RESULT_LIMIT)}… (truncated)` : text;
}

/** Each tool's argument validator, compiled once per executor. */
export class ToolValidators {
  private readonly ajv = new Ajv({ allErrors: false, strict: false });
  private readonly validators = new Map<ToolDefinition, ValidateFunction>();

  /** Null when the arguments fit the tool's parameters, else why not. */
  problem(tool: ToolDefinition, args: unknown): string | null {
    let validate = this.validators.get(tool);
    if (!validate) {
      validate = this.ajv.compile(tool.parameters);
      this.validators.set(tool, validate);
    }
    return validate(args) ? null : this.ajv.errorsText(validate.errors);
  }
}

/** What a drive needs besides the run: the process's pool, sealer and worker, and the run's provider chain. */
export type StepContext = {
  hand: RunInHand;
  pool: DatabasePool;
  sealer: Sealer;
  fetch: GuardedFetch;
  afterCommit: AfterCommit;
  tools: ToolValidators;
  providerChain: ProviderChain;
  /** a2a.maxArtifactBytes: the largest artifact (or answer) the agent may produce. */
  maxArtifactBytes: number;
  /** Takes what a step answers after the run was cancelled: recorded as discarded, never applied. */
  discard: DiscardLate;
};

/** Stores artifacts the model emitted as one committed run step, at the answer level read under the lock. */
async function storeArtifacts(ctx: StepContext, iteration: number, emissions: Parameters<typeof outputFromEmission>[1][]): Promise<boolean> {
  if (emissions.length === 0) return true;
  const { pool, sealer, hand } = ctx;
  const { runId, holder } = hand;
  const stored = await pool.transaction(async (transaction) => {
    const held = await lockHeldRun(transaction, runId, holder);
    if (!held || !(await announceRunOutputs(transaction, runId, holder))) return false;
    await appendRunOutputs(
      transaction,
      sealer,
      runId,
      held.revision + 1,
      held.answerLevel,
      emissions.map((emission, index) => outputFromEmission('artifact', emission, `artifact-${iteration}-${index}`)),
    );
    hand.storedOutputs += emissions.length;
    return true;
  });
  if (!stored) hand.fence.refuse('outputs', emissions.length);
  return stored;
}

async function checkpoint(ctx: StepContext): Promise<CheckpointResult> {
  const ok = await ctx.hand.audit.flushIfDue(ctx.pool).then(() => ctx.hand.lease.checkpoint());
  return ok === null ? { alive: true } : { alive: false, why: ok };
}

async function callModel(ctx: StepContext, state: LoopContext): Promise<ModelStepResult> {
  const { hand } = ctx;
  const answer = await ctx.providerChain.call(state);
  if (answer.kind !== 'reply') return answer;
  const { reply } = answer;
  // An artifact over a2a.maxArtifactBytes fails the run before any of the reply is written.
  const oversized = oversizedArtifact(reply.artifacts, reply.outcome ? null : reply.text, ctx.maxArtifactBytes);
  if (oversized) return { kind: 'failed', reason: 'not_retryable', errorClass: 'artifact_too_large', detail: artifactTooLargeDetail(oversized) };
  if (!(await storeArtifacts(ctx, state.iteration, reply.artifacts))) return { kind: 'stop', why: hand.lease.loss ?? 'lease_lost' };
  if (reply.artifacts.length > 0) ctx.afterCommit(hand.runId);
  const approvalRequired = reply.toolCalls.some((call) => hand.agent.tools.get(call.name)?.needsApproval === true);
  return {
    kind: 'reply',
    text: reply.text,
    toolCalls: reply.toolCalls,
    approvalRequired,
    providerIndex: answer.providerIndex,
    inputTokens: reply.usage.inputTokens,
    outputTokens: reply.usage.outputTokens,
    ...(reply.outcome ? { outcome: reply.outcome } : {}),
  };
}

/** One tool call through its declared effect: audited first (a write tool whose record cannot be stored does not run). */
async function runOneTool(ctx: StepContext, call: ToolCall): Promise<ToolResult | 'stop'> {
  const { pool, hand } = ctx;
  const { runId, agent, audit, lease, runLog, holder } = hand;
  const tool = agent.tools.get(call.name);
  if (!tool) return { kind: 'error', message: `unknown tool ${call.name}` };
  const invalid = ctx.tools.problem(tool, call.arguments);
  if (invalid !== null) return { kind: 'error', message: `invalid arguments for ${call.name}: ${invalid}` };
  const event = { kind: 'tool_call', meta: { tool: call.name, effect: tool.effect, callId: call.id }, content: { arguments: call.arguments } };
  if (tool.effect !== 'read_only') {
    // A write tool whose audit event cannot be stored does not run.
    if (!(await audit.recordNow(pool, event))) return { kind: 'error', message: `tool ${call.name} was not run: its audit record could not be stored` };
  } else {
    audit.record(event);
  }
  if (tool.effect === 'non_idempotent_write') {
    if (!(await markNonIdempotentCall(pool, runId, holder, call.id))) {
      hand.fence.refuse('non_idempotent_mark');
      return 'stop';
    }
  }
  const startedAt = Date.now();
  let result: ToolResult;
  // A cancel stops the wait for the tool at once, whether it honours its signal or not; what it
  // still answers is discarded (decision 0066).
  const run = () => tool.run(call.arguments, { runId, agentId: agent.config.id, toolCallId: call.id, fetch: ctx.fetch, signal: lease.abort.signal, logger: runLog });
  const running = started(() => (tracingEnabled() ? inToolSpan(call, tool.effect, run) : run()));
  hand.current = { step: 'tool', name: call.name, callId: call.id };
  try {
    const raced = await unlessCancelled(running, lease.cancelled.signal);
    if (!raced.done) {
      ctx.discard(
        running.then(
          (late): LateOutcome => ({ outcome: late.kind, ...(late.kind === 'dependency' ? { dependencyId: late.dependencyId } : {}) }),
          (): LateOutcome => ({ outcome: 'error' }),
        ),
        { step: 'tool', tool: call.name, callId: call.id },
      );
      return 'stop';
    }
    result = raced.value;
  } catch (error) {
    result = { kind: 'error', message: `tool ${call.name} failed: ${(error as Error).message}` };
  } finally {
    hand.current = null;
  }
  // The mark is not cleared here: the call's result lives only in this drive's memory until the
  // run settles or suspends (both store the state and clear the mark in one statement). Cleared
  // earlier, a drive that lost its connection after the call was driven again, or requeued, from
  // the stored row and made the call a second time (two charges in hosts-postgres-cutoff, once
  // the server ended the cut-off sessions: decision 0092). Until then a lost lease dead-letters
  // the run, as inside the call.
  audit.record({
    kind: 'tool_result',
    meta: { tool: call.name, callId: call.id, outcome: result.kind, durationMs: Date.now() - startedAt },
    content:
      result.kind === 'ok'
        ? { result: result.content }
        : result.kind === 'error'
          ? { error: result.message }
          : result.kind === 'input_required'
            ? { prompt: result.prompt }
            : { dependency: result.dependencyId },
  });
  return result;
}

async function runTools(ctx: StepContext, calls: ToolCall[]): Promise<ToolStepResult> {
  const { lease } = ctx.hand;
  const messages: TranscriptMessage[] = [];
  let pendingInput: Extract<ToolStepResult, { kind: 'input_required' }>['pending'] | null = null;
  let pendingDependency: Extract<ToolStepResult, { kind: 'dependency' }>['pending'] | null = null;
  for (const call of calls) {
    if (lease.loss) return { kind: 'stop', why: lease.loss };
    if (pendingInput || pendingDependency) {
      messages.push({ role: 'tool', toolCallId: call.id, name: call.name, content: 'not run: an earlier call of this turn is waiting' });
      continue;
    }
    const checked = await checkpoint(ctx);
    if (!checked.alive) return { kind: 'stop', why: checked.why };
    const result = await runOneTool(ctx, call);
    if (result === 'stop') return { kind: 'stop', why: lease.loss ?? 'lease_lost' };
    if (result.kind === 'input_required') {
      pendingInput = { toolCallId: call.id, toolName: call.name, prompt: result.prompt, schema: result.schema };
      continue;
    }
    if (result.kind === 'dependency') {
      pendingDependency = { toolCallId: call.id, toolName: call.name, dependencyId: result.dependencyId };
      continue;
    }
    messages.push({
      role: 'tool',
      toolCallId: call.id,
      name: call.name,
      content: result.kind === 'ok' ? toolContent(result.content) : `error: ${result.message}`,
    });
  }
  if (pendingDependency) return { kind: 'dependency', messages, pending: pendingDependency };
  return pendingInput ? { kind: 'input_required', messages, pending: pendingInput } : { kind: 'done', messages };
}

async function checkGuardrails(ctx: StepContext, { stage, text }: { stage: 'input' | 'answer'; text: string }): Promise<GuardrailOutcome> {
  const { agent, audit, runId } = ctx.hand;
  // Invoked only for a stage a guardrail of the agent's checks (`guarded`): every verdict is recorded.
  const verdict = await evaluateGuardrails(agent.guardrails, { stage, text, runId, agentId: agent.config.id });
  audit.record({ kind: 'guardrail', meta: { stage, verdict: verdict.verdict, ...(verdict.verdict === 'allow' ? {} : { guardrail: verdict.guardrail }) } });
  return verdict;
}

/**
 * How the run ends: stepped through the agent loop, or driven by a statechart agent's own
 * machine, durable transition by transition (its output's artifacts are part of the result,
 * written by the completion transaction).
 */
export async function driveRun(ctx: StepContext, state: LoopState, loopStepper: MachineStepper<typeof agentLoopMachine>): Promise<DrivenRun> {
  const { hand } = ctx;
  const { agent } = hand;
  if (agent.statechart) {
    return runStatechartAgent({
      pool: ctx.pool,
      sealer: ctx.sealer,
      runId: hand.runId,
      taskId: hand.run.task_id,
      holder: hand.holder,
      fence: hand.fence,
      agent,
      definition: agent.statechart,
      state,
      audit: hand.audit,
      logger: hand.runLog,
      fetch: ctx.fetch,
      signal: hand.lease.abort.signal,
      cancelled: hand.lease.cancelled.signal,
      discard: ctx.discard,
      current: (step) => (hand.current = step),
      providerChain: ctx.providerChain,
      checkpoint: () => checkpoint(ctx),
      runTool: (call) => runOneTool(ctx, call),
      shown: () => {
        hand.storedOutputs += 1;
        ctx.afterCommit(hand.runId);
      },
      maxArtifactBytes: ctx.maxArtifactBytes,
    });
  }
  const steps: MachineSteps<typeof agentLoopMachine> = {
    checkpoint: () => checkpoint(ctx),
    checkGuardrails: (input) => checkGuardrails(ctx, input),
    callModel: ({ context }) => callModel(ctx, context),
    runTools: ({ calls }) => runTools(ctx, calls),
  };
  const limits = { maxIterations: agent.config.limits.maxIterations, tokenBudget: agent.config.limits.tokenBudget ?? null };
  const guarded = guardedStagesOf(agent.guardrails);
  // The context's own fields first, the state spread last (a loop state has none of them):
  // `{ ...state, limits }` would make a hidden class per run on Node 20
  // (docs/decisions/0050-no-leading-spread-on-the-hot-path.md).
  const stepped = await loopStepper.run({ limits, guarded, outcome: null, ...state }, steps);
  const { limits: _limits, guarded: _guarded, outcome: _outcome, ...ended } = stepped.context;
  return { outcome: stepped.output, state: ended, artifacts: [] };
}
