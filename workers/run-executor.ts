import type { Job } from 'bullmq';
import { Ajv, type ValidateFunction } from 'ajv';
import {
  agentLoopMachine,
  freshLoopState,
  type CheckpointResult,
  type GuardrailOutcome,
  type LoopContext,
  type LoopOutcome,
  type LoopState,
  type ModelStepResult,
  type ToolStepResult,
} from '../machines/agent-loop.machine.js';
import { createMachineStepper, type MachineSteps } from '../machines/step-machine.js';
import type { AgentRegistry, RegisteredAgent } from '../src/agents/agent-registry.js';
import { evaluateGuardrails, guardedStagesOf } from '../src/guardrails/guardrail.js';
import type { GuardedFetch } from '../src/net/guarded-fetch.js';
import type { Sealer } from '../src/sealing/sealer.js';
import { scrubTaskJournal } from '../src/tasks/journal.js';
import { clearStatusMessage, recordAgentStatusMessage, scrubTaskContent, tightenTaskContent } from '../src/tasks/task-repository.js';
import type { ArtifactEmission, ToolCall, TranscriptMessage } from '../src/providers/provider.js';
import { AuditTrail } from '../src/runs/audit-trail.js';
import { completeRun, failHeldRun, type CompletionInput, type CompletionResult, type FailureInput, type JournaledEnd } from '../src/tasks/complete-run.js';
import type { CompletionBatch } from '../src/tasks/completion-batch.js';
import type { ProjectionOptions } from '../src/tasks/journal-writer.js';
import type { LocalCommit } from '../src/tasks/journal-listener.js';
import { isConnectionError } from '../src/db/pool.js';
import { LeaseKeeper } from '../src/runs/lease-keeper.js';
import { appendRunOutputs, outputFromEmission } from '../src/runs/run-output-repository.js';
import { applyLinkCeilings, appliedLinkIndex, providerChainOf, type RetryPolicy, type ScrubServedTask } from '../src/runs/provider-chain.js';
import {
  announceRunOutputs,
  claimDueTimer,
  claimQueuedRun,
  lockHeldRun,
  markNonIdempotentCall,
  releaseRun,
  queuedRequestContext,
  suspendRun,
  suspendedStateContext,
  takeOverHandoff,
  type RunTotals,
} from '../src/runs/run-repository.js';
import { runRequestSchema } from '../src/runs/run-request.js';
import { runJobId, timerJobId } from '../src/queue/job-ids.js';
import { FIRST_CLAIM_REVISION, isFirstClaim, type RunRow } from '../src/runs/run-row.js';
import type { FastRun, FastRunSlot, FastRuns } from '../src/runs/fast-runs.js';
import type { RunRequest } from '../src/runs/run-request.js';
import { heldRowsOfFastRun } from '../src/tasks/task-creation.js';
import type { KeelContext } from '../src/context/keel-context.js';
import type { ToolDefinition, ToolResult } from '../src/tools/tool.js';
import { runStatechartAgent } from './statechart-agent-run.js';

// The runs queue's processor: claims a run, rebuilds it from its sealed request (or suspended
// turn), steps the agent loop machine through its pure transitions, and settles, suspends or stops. Every write is
// one of the run repository's guarded transitions; a worker that lost its lease writes nothing.

export type ExecutorOptions = RetryPolicy & {
  leaseMs: number;
  heartbeatMs: number;
  /**
   * The fast path (docs/decisions/0025-fast-path.md): how many runs this process may take at
   * insert, besides the queue's. 0 turns it off. The queue's worker is told how many are in
   * flight (`onFastRuns`), so queued and fast runs share one bound.
   */
  fastSlots?: number;
  onFastRuns?: (inFlight: number) => void;
  /** The bound both kinds share (runs.concurrency): the queue's share is what fast runs leave, at least one. */
  concurrency?: number;
  /** Completions written together with other runs' (group commit); without it each has its own transaction. */
  completions?: CompletionBatch;
  /** Told of every run this executor starts, and by which path (metrics). */
  onRunStarted?: (path: 'fast' | 'queue') => void;
  /** The push outbox's bounds, for the deliveries a run's end writes with its journal rows. */
  projection?: ProjectionOptions;
};

/** How a run's loop or machine ended, with the state to settle it from (and a statechart output's artifacts). */
type DrivenRun = { outcome: LoopOutcome; state: LoopState; artifacts: readonly ArtifactEmission[] };

export type ExecutionReport =
  | { kind: 'skipped' }
  | { kind: 'settled'; status: 'completed' | 'failed'; reason: string }
  | { kind: 'suspended'; status: string }
  | { kind: 'stopped'; why: 'lease_lost' | 'cancelled' };

/**
 * Called after each commit that changed the run (the projector turns revisions into journal
 * events); `settleSoon` marks a claim, after which a fast run usually settles within moments.
 */
export type AfterCommit = (runId: string, settleSoon?: boolean) => void;

/**
 * How the process hears of a run's end that the settling transaction journaled itself
 * (docs/decisions/0022-completion-writes-the-journal.md).
 */
export type EndJournaling = {
  /**
   * Before the transaction: a projection of the run still waiting to coalesce is dropped (the
   * settle journals what it would have), and this process's blocking requests for the task await
   * the transaction's outcome.
   */
  begin: (runId: string, taskId: string) => LocalCommit;
  /** After its COMMIT returned: its deliveries are woken. */
  journaled: (runId: string, end: JournaledEnd) => Promise<void>;
};

const NO_END_JOURNALING: EndJournaling = {
  begin: () => ({ committed: () => undefined, unknown: () => undefined }),
  journaled: async () => undefined,
};

export type RunExecutor = {
  execute: (runId: string) => Promise<ExecutionReport>;
  /**
   * Graceful shutdown: waits up to `graceMs` for runs in flight, then releases the rest (back to
   * QUEUED for another worker, without counting a requeue).
   */
  drain: (graceMs: number) => Promise<{ finished: number; released: number }>;
  processor: (job: Job<{ runId: string }>) => Promise<ExecutionReport>;
  /** Slots for runs inserted already claimed by this process (src/runs/fast-runs.ts). */
  fastRuns: FastRuns;
  /** The queue's worker found no job waiting: new tasks may take the fast path again. */
  queueDrained: () => void;
};

const TOOL_RESULT_LIMIT = 64 * 1024;
/**
 * How long a full queue share keeps the fast path to half the slots unless seen full again: a
 * bound in case the queue's worker never reports it drained (the queue ran dry on another process).
 */
const QUEUE_BACKLOG_MS = 1000;

const totalsOf = (state: LoopState): RunTotals => ({
  iterations: state.iteration,
  toolCalls: state.toolCallCount,
  inputTokens: state.inputTokens,
  outputTokens: state.outputTokens,
});

function toolContent(result: unknown): string {
  const text = typeof result === 'string' ? result : (JSON.stringify(result) ?? 'null');
  return text.length > TOOL_RESULT_LIMIT ? `${text.slice(0, TOOL_RESULT_LIMIT)}… (truncated)` : text;
}

/**
 * A fallback's tightened answer ceiling reaches the task the run serves: its stored content is
 * removed (no result can be kept) or rewritten down, and its journal with it.
 */
const scrubServedTaskWith =
  (sealer: Sealer): ScrubServedTask =>
  async (transaction, taskId, change) => {
    if (change.answers === 'not_retainable') {
      await scrubTaskContent(transaction, taskId);
    } else {
      // The task row first, as the projector locks it before it writes the journal: a
      // projection in flight commits before the journal is read for the scrub.
      await tightenTaskContent(transaction, sealer, taskId, change.next.answerLevel);
    }
    await scrubTaskJournal(transaction, sealer, taskId, change.next.answerLevel);
  };

export function createRunExecutor(
  context: KeelContext,
  registry: AgentRegistry,
  fetch: GuardedFetch,
  options: ExecutorOptions,
  afterCommit: AfterCommit = () => undefined,
  onDependencyWait: (dependencyId: string) => void = () => undefined,
  endJournaling: EndJournaling = NO_END_JOURNALING,
): RunExecutor {
  const { pool, sealer, logger, workerId } = context;
  const projection = options.projection;

  /**
   * A settle that ends the run (completion or the worker's failure). When its transaction journaled
   * the end, the task as it wrote it goes to this process's waiters once the COMMIT has returned,
   * and no projection is owed; otherwise (nothing journaled, or an error: a COMMIT whose outcome is
   * unknown) the waiters read, and the projector is woken as after any commit.
   */
  async function settleEnd(runId: string, taskId: string | null, settle: () => Promise<CompletionResult>): Promise<CompletionResult> {
    const local = taskId === null ? null : endJournaling.begin(runId, taskId);
    let result: CompletionResult;
    try {
      result = await settle();
    } catch (error) {
      local?.unknown();
      // Whatever was committed before (a claim's revision) is still owed to the journal.
      afterCommit(runId);
      throw error;
    }
    const end = result.journaled;
    if (end?.write.notice) local?.committed(end.task, end.write.notice);
    else local?.unknown();
    if (end) {
      await endJournaling.journaled(runId, end).catch((error: Error) => logger.warn({ err: error, runId }, 'push wake-ups after a journaled end failed; the sweeper adds them'));
    } else {
      afterCommit(runId);
    }
    return result;
  }

  const complete = (input: CompletionInput) => (options.completions ? options.completions.complete(input) : completeRun(pool, sealer, logger, input));
  const failHeld = (runId: string, input: Omit<FailureInput, 'runId' | 'workerId' | 'projection'>) =>
    settleEnd(runId, input.taskId, () => failHeldRun(pool, sealer, logger, { ...input, runId, workerId, ...(projection ? { projection } : {}) }));
  const claim = { workerId, leaseMs: options.leaseMs };
  const ajv = new Ajv({ allErrors: false, strict: false });
  const validators = new Map<ToolDefinition, ValidateFunction>();
  const validatorFor = (tool: ToolDefinition) => {
    let validate = validators.get(tool);
    if (!validate) {
      validate = ajv.compile(tool.parameters);
      validators.set(tool, validate);
    }
    return validate;
  };

  /** Rebuilds the loop state from the durable row: a suspended turn if there is one, else the request. */
  function rebuild(run: RunRow, agent: RegisteredAgent, inserted: RunRequest | null): { ok: true; state: LoopState } | { ok: false; detail: string } {
    if (run.suspended_state) {
      const opened = sealer.openJson<LoopState>(suspendedStateContext(run.id), run.suspended_state);
      if (!opened.ok) return { ok: false, detail: `suspended state cannot be opened (${opened.reason})` };
      return { ok: true, state: opened.value };
    }
    let request: RunRequest;
    if (inserted) {
      // A fast run: the request this process sealed into the row a moment ago.
      request = inserted;
    } else {
      if (!run.queued_request) return { ok: false, detail: 'the run has no stored request' };
      const opened = sealer.openJson(queuedRequestContext(run.id), run.queued_request);
      if (!opened.ok) return { ok: false, detail: `request cannot be opened (${opened.reason})` };
      const parsed = runRequestSchema.safeParse(opened.value);
      if (!parsed.success) return { ok: false, detail: 'the stored request is malformed' };
      request = parsed.data as RunRequest;
    }
    const system: TranscriptMessage[] = agent.config.systemPrompt ? [{ role: 'system', content: agent.config.systemPrompt }] : [];
    return { ok: true, state: freshLoopState([...system, ...request.messages], request.metadata) };
  }

  // The agent loop runs without an actor per run: the stepper computes each macrostep with the
  // machine's pure transition and runs the step its new state invokes (decision 0023). Made once,
  // it refuses here, at start, a machine with effects it could not carry out.
  const loopStepper = createMachineStepper(agentLoopMachine);

  type Slot = { lease: LeaseKeeper | null; done: Promise<void> };
  const inFlight = new Map<string, Slot>();
  let draining = false;

  async function inSlot(runId: string, work: (slot: Slot) => Promise<ExecutionReport>): Promise<ExecutionReport> {
    let finish: () => void = () => undefined;
    const slot: Slot = { lease: null, done: new Promise<void>((resolve) => (finish = resolve)) };
    inFlight.set(runId, slot);
    try {
      return await work(slot);
    } finally {
      inFlight.delete(runId);
      finish();
    }
  }

  /** Runs taken from the queue now in flight (for the fast path's fairness rule below). */
  let queuedInFlight = 0;
  /** Until then the queue may hold waiting runs: new tasks take the queue. */
  let queueBacklogUntil = 0;
  const queueSaturated = () => queuedInFlight >= Math.max(1, sharedSlots - fastInFlight);

  /**
   * A statechart run whose timer is due: taken from its wait with the claim, and a prompt it was
   * asking stops being its task's status message in the same transaction (run row first, then task).
   */
  const claimTimedOutWait = (runId: string) =>
    pool.transaction(async (transaction) => {
      const row = await claimDueTimer(transaction, runId, claim);
      if (row?.task_id) await clearStatusMessage(transaction, row.task_id);
      return row;
    });

  async function execute(runId: string): Promise<ExecutionReport> {
    if (draining) return { kind: 'skipped' };
    queuedInFlight += 1;
    if (queueSaturated()) queueBacklogUntil = Date.now() + QUEUE_BACKLOG_MS;
    return inSlot(runId, async (slot) => {
      const run = (await claimQueuedRun(pool, runId, claim)) ?? (await takeOverHandoff(pool, runId, claim)) ?? (await claimTimedOutWait(runId));
      if (!run) return { kind: 'skipped' };
      afterCommit(runId, true);
      options.onRunStarted?.('queue');
      return executeClaimed(run, slot, null);
    }).finally(() => (queuedInFlight -= 1));
  }

  // Fast runs: reserved before their task is written, counted until they leave the executor. A
  // reservation that is never started or cancelled would hold a slot for good, so a reservation
  // is a one-shot object.
  const fastSlots = options.fastSlots ?? 0;
  const sharedSlots = options.concurrency ?? fastSlots + 1;
  let fastInFlight = 0;
  const fastChanged = (delta: number) => {
    fastInFlight += delta;
    options.onFastRuns?.(fastInFlight);
  };

  /** The row a fast run's insert wrote (runValues with a FastStart), without reading it back. */
  const insertedRow = (run: FastRun): RunRow => ({
    id: run.id,
    agent: run.agent,
    status: 'running',
    termination_reason: null,
    truncated: false,
    revision: FIRST_CLAIM_REVISION,
    claimed_by: workerId,
    lease_expires_at: run.at + options.leaseMs,
    requeue_count: 0,
    available_at: run.at,
    audit_level: run.auditLevel,
    answer_level: run.answerLevel,
    queued_request: null,
    suspended_state: null,
    iterations: 0,
    tool_calls: 0,
    input_tokens: 0,
    output_tokens: 0,
    error_class: null,
    inside_non_idempotent_call: null,
    failure_detail: null,
    provider: run.provider,
    task_id: run.taskId,
    status_changed_at: run.at,
    created_at: run.at,
    updated_at: run.at,
    started_at: run.at,
    settled_at: null,
  });

  const fastRuns: FastRuns = {
    reserve: (): FastRunSlot | null => {
      // Fairness: once the queue's share was full, runs may be waiting in the queue (requeued,
      // resumed, received by another process). Fast runs, which would take every slot as it frees
      // up, then hold at most half the slots until the queue's worker finds it empty (BullMQ's
      // 'drained'), so the queue's runs always get the other half.
      if (queueSaturated()) queueBacklogUntil = Date.now() + QUEUE_BACKLOG_MS;
      const limit = Date.now() < queueBacklogUntil ? Math.min(fastSlots, Math.floor(sharedSlots / 2)) : fastSlots;
      // A free slot: fast and queued runs in flight share runs.concurrency.
      if (draining || fastInFlight >= limit || fastInFlight + queuedInFlight >= sharedSlots) return null;
      fastChanged(1);
      let used = false;
      return {
        claim,
        start: (run) => {
          if (used) return;
          used = true;
          if (draining) {
            // Shutting down since the slot was taken: the run goes back to the queue for another worker.
            void releaseRun(pool, run.id, workerId)
              .then((released) => released && context.queues.addJob('runs', runJobId(run.id), { runId: run.id }))
              .catch((error: Error) => logger.warn({ err: error, runId: run.id }, 'a fast run could not be handed back at shutdown; its lease expires and the reaper requeues it'))
              .finally(() => fastChanged(-1));
            return;
          }
          options.onRunStarted?.('fast');
          void inSlot(run.id, (slot) => executeClaimed(insertedRow(run), slot, run))
            .catch((error: Error) => logger.error({ err: error, runId: run.id }, 'fast run stopped; its lease expires and the reaper requeues it'))
            .finally(() => fastChanged(-1));
        },
        cancel: () => {
          if (used) return;
          used = true;
          fastChanged(-1);
        },
      };
    },
  };

  async function executeClaimed(run: RunRow, slot: Slot, fast: FastRun | null): Promise<ExecutionReport> {
    const runId = run.id;
    const insertedRequest = fast?.request ?? null;
    const runLog = logger.child({ runId, agent: run.agent });

    // A run claimed for the first time has no audit rows and no stored outputs yet.
    const fresh = isFirstClaim(run);
    const agent = registry.get(run.agent);
    if (!agent) {
      await failHeld(runId, { reason: 'not_retryable', failureDetail: { reason: 'unknown_agent', agent: run.agent }, taskId: run.task_id, hasOutputs: !fresh });
      return { kind: 'settled', status: 'failed', reason: 'not_retryable' };
    }
    // A fast run's rows are known as its insert left them: its completion checks them instead of
    // reading them (decision 0029). Not for a statechart agent's run (its revision moves as it
    // goes) nor a task with a push config (its deliveries are written by the transaction).
    const held = fast && !agent.statechart && !fast.task.pushConfigured ? heldRowsOfFastRun(fast) : null;
    const rebuilt = rebuild(run, agent, insertedRequest);
    if (!rebuilt.ok) {
      await failHeld(runId, { reason: 'not_retryable', failureDetail: { reason: rebuilt.detail }, taskId: run.task_id, hasOutputs: !fresh });
      return { kind: 'settled', status: 'failed', reason: 'not_retryable' };
    }

    const audit = fresh ? new AuditTrail(runId, run.audit_level, 0, runLog) : await AuditTrail.open(pool, runId, run.audit_level, runLog);
    audit.record({
      kind: run.suspended_state ? 'resumed' : 'claimed',
      meta: { worker: workerId, revision: run.revision, requeues: run.requeue_count, ...(insertedRequest ? { fastPath: true } : {}) },
    });
    const resume = rebuilt.state.resume;
    if (resume?.kind === 'approval') {
      audit.record({ kind: 'approval_decided', meta: { approved: resume.approved, digest: resume.digest, pending: rebuilt.state.pendingApproval?.kind ?? null } });
    } else if (resume?.kind === 'input') {
      audit.record({ kind: 'input_received', meta: { tool: rebuilt.state.pendingInput?.toolName ?? null }, content: { value: resume.value } });
    }
    const lease = new LeaseKeeper(pool, runId, workerId, options.leaseMs, options.heartbeatMs, runLog);
    // A long step (a slow provider call) does not hold the audit trail back past one heartbeat.
    lease.onBeat = () => void audit.flushIfDue(pool, options.heartbeatMs);
    lease.start();
    slot.lease = lease;
    const scrubServedTask = scrubServedTaskWith(sealer);
    const providerChain = providerChainOf(
      {
        runId,
        chain: agent.chain,
        tools: [...agent.tools.values()].map((tool) => ({ name: tool.name, description: tool.description, parameters: tool.parameters })),
        policy: options,
        audit,
        lease,
        switchTo: async (index) => {
          const switched = await applyLinkCeilings(pool, sealer, { runId, workerId, taskId: run.task_id, audit }, agent.chain[index]!, index, scrubServedTask);
          afterCommit(runId);
          return switched;
        },
      },
      appliedLinkIndex(agent.chain, run.provider),
    );

    // A resumed or requeued run may have stored artifacts before: then completion reads them.
    let storedOutputs = fresh ? 0 : 1;

    /** Stores artifacts the model emitted as one committed run step, at the answer level read under the lock. */
    async function storeArtifacts(iteration: number, emissions: Parameters<typeof outputFromEmission>[1][]): Promise<boolean> {
      if (emissions.length === 0) return true;
      return pool.transaction(async (transaction) => {
        const held = await lockHeldRun(transaction, runId, workerId);
        if (!held || !(await announceRunOutputs(transaction, runId, workerId))) return false;
        await appendRunOutputs(
          transaction,
          sealer,
          runId,
          held.revision + 1,
          held.answerLevel,
          emissions.map((emission, index) => outputFromEmission('artifact', emission, `artifact-${iteration}-${index}`)),
        );
        storedOutputs += emissions.length;
        return true;
      });
    }

    const checkpoint = async (): Promise<CheckpointResult> => {
      const ok = await audit.flushIfDue(pool).then(() => lease.checkpoint());
      return ok === null ? { alive: true } : { alive: false, why: ok };
    };

    const callModel = async (state: LoopContext): Promise<ModelStepResult> => {
      const answer = await providerChain.call(state);
      if (answer.kind !== 'reply') return answer;
      const { reply } = answer;
      if (!(await storeArtifacts(state.iteration, reply.artifacts))) return { kind: 'stop', why: lease.loss ?? 'lease_lost' };
      if (reply.artifacts.length > 0) afterCommit(runId);
      const approvalRequired = reply.toolCalls.some((call) => agent.tools.get(call.name)?.needsApproval === true);
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
    };

    const runOneTool = async (call: ToolCall): Promise<ToolResult | 'stop'> => {
      const tool = agent.tools.get(call.name);
      if (!tool) return { kind: 'error', message: `unknown tool ${call.name}` };
      const validate = validatorFor(tool);
      if (!validate(call.arguments)) return { kind: 'error', message: `invalid arguments for ${call.name}: ${ajv.errorsText(validate.errors)}` };
      const event = { kind: 'tool_call', meta: { tool: call.name, effect: tool.effect, callId: call.id }, content: { arguments: call.arguments } };
      if (tool.effect !== 'read_only') {
        // A write tool whose audit event cannot be stored does not run.
        if (!(await audit.recordNow(pool, event))) return { kind: 'error', message: `tool ${call.name} was not run: its audit record could not be stored` };
      } else {
        audit.record(event);
      }
      if (tool.effect === 'non_idempotent_write') {
        if (!(await markNonIdempotentCall(pool, runId, workerId, call.id))) return 'stop';
      }
      const started = Date.now();
      let result: ToolResult;
      try {
        result = await tool.run(call.arguments, { runId, agentId: agent.config.id, toolCallId: call.id, fetch, signal: lease.abort.signal, logger: runLog });
      } catch (error) {
        result = { kind: 'error', message: `tool ${call.name} failed: ${(error as Error).message}` };
      }
      if (tool.effect === 'non_idempotent_write') await markNonIdempotentCall(pool, runId, workerId, null);
      audit.record({
        kind: 'tool_result',
        meta: { tool: call.name, callId: call.id, outcome: result.kind, durationMs: Date.now() - started },
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
    };

    const runTools = async (state: LoopContext, calls: ToolCall[]): Promise<ToolStepResult> => {
      const messages: TranscriptMessage[] = [];
      let pendingInput: Extract<ToolStepResult, { kind: 'input_required' }>['pending'] | null = null;
      let pendingDependency: Extract<ToolStepResult, { kind: 'dependency' }>['pending'] | null = null;
      for (const call of calls) {
        if (lease.loss) return { kind: 'stop', why: lease.loss };
        if (pendingInput || pendingDependency) {
          messages.push({ role: 'tool', toolCallId: call.id, name: call.name, content: 'not run: an earlier call of this turn is waiting' });
          continue;
        }
        const checked = await checkpoint();
        if (!checked.alive) return { kind: 'stop', why: checked.why };
        const result = await runOneTool(call);
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
      void state;
      if (pendingDependency) return { kind: 'dependency', messages, pending: pendingDependency };
      return pendingInput ? { kind: 'input_required', messages, pending: pendingInput } : { kind: 'done', messages };
    };

    const checkGuardrails = async ({ stage, text }: { stage: 'input' | 'answer'; text: string }): Promise<GuardrailOutcome> => {
      // Invoked only for a stage a guardrail of the agent's checks (`guarded`): every verdict is recorded.
      const verdict = await evaluateGuardrails(agent.guardrails, { stage, text, runId, agentId: agent.config.id });
      audit.record({ kind: 'guardrail', meta: { stage, verdict: verdict.verdict, ...(verdict.verdict === 'allow' ? {} : { guardrail: verdict.guardrail }) } });
      return verdict;
    };

    const steps: MachineSteps<typeof agentLoopMachine> = {
      checkpoint: () => checkpoint(),
      checkGuardrails: (input) => checkGuardrails(input),
      callModel: ({ context: state }) => callModel(state),
      runTools: ({ context: state, calls }) => runTools(state, calls),
    };
    const limits = { maxIterations: agent.config.limits.maxIterations, tokenBudget: agent.config.limits.tokenBudget ?? null };
    const guarded = guardedStagesOf(agent.guardrails);

    /**
     * How the run ends: stepped through the agent loop, or driven by a statechart agent's own
     * machine, durable transition by transition (its output's artifacts are part of the result,
     * written by the completion transaction).
     */
    const drive = async (): Promise<DrivenRun> => {
      if (agent.statechart) {
        return runStatechartAgent({
          pool,
          sealer,
          runId,
          taskId: run.task_id,
          workerId,
          agent,
          definition: agent.statechart,
          state: rebuilt.state,
          audit,
          logger: runLog,
          fetch,
          signal: lease.abort.signal,
          providerChain,
          checkpoint,
          runTool: runOneTool,
          shown: () => {
            storedOutputs += 1;
            afterCommit(runId);
          },
        });
      }
      // The context's own fields first, the state spread last (a loop state has none of them):
      // `{ ...state, limits }` would make a hidden class per run on Node 20
      // (docs/decisions/0050-no-leading-spread-on-the-hot-path.md).
      const stepped = await loopStepper.run({ limits, guarded, outcome: null, ...rebuilt.state }, steps);
      const { limits: _limits, guarded: _guarded, outcome: _outcome, ...state } = stepped.context;
      return { outcome: stepped.output, state, artifacts: [] };
    };
    let driven: DrivenRun;
    try {
      driven = await drive();
    } catch (error) {
      runLog.error({ err: error }, 'the run crashed; it stays claimed until its lease expires');
      throw error;
    } finally {
      lease.stop();
    }
    return settleOutcome(driven.outcome, driven.state, driven.artifacts);

    /** `resultArtifacts`: artifacts of the result (a statechart's output), written by the completion transaction. */
    async function settleOutcome(result: LoopOutcome, state: LoopState, resultArtifacts: readonly ArtifactEmission[] = []): Promise<ExecutionReport> {
      const totals = totalsOf(state);
      switch (result.kind) {
        case 'stop':
          await audit.flush(pool);
          if (lease.released) {
            const released = await releaseRun(pool, runId, workerId);
            if (released) {
              afterCommit(runId);
              // The job being processed holds the run's usual id until this returns: the wake-up for
              // another worker needs an id of its own, or BullMQ drops it as a duplicate.
              await context.queues.addJob('runs', `${runJobId(runId, released.requeue_count)}-v${released.revision}`, { runId }).catch(() => undefined);
            }
          }
          return { kind: 'stopped', why: result.why };
        case 'complete': {
          audit.record({ kind: 'completed', meta: { reason: result.reason, ...totals } });
          const taskId = run!.task_id;
          const settled = await settleEnd(runId, taskId, () =>
            complete({
              beforeSettle: (transaction) => audit.flushWithin(transaction),
              resultOutputs: resultArtifacts.map((emission, index) => outputFromEmission('artifact', emission, `output-${index}`)),
              takeAuditRows: (transaction) => audit.takeUnrefusableRows(transaction),
              rolledBack: () => audit.restoreTaken(),
              ...(held ? { held } : {}),
              taskId,
              hasOutputs: storedOutputs > 0 || resultArtifacts.length > 0,
              runId,
              workerId,
              reason: result.reason,
              answer: result.answer,
              ...(result.presentation ? { presentation: result.presentation } : {}),
              totals,
              ...(projection ? { projection } : {}),
            }),
          ).catch(async (error: Error) => {
            // The database out of reach is not the result's fault: the run keeps its claim, its lease
            // expires and the reaper requeues it (settling it as failed could not be written anyway).
            if (isConnectionError(error)) throw error;
            runLog.error({ err: error }, 'the result could not be stored; failing the run');
            const failed = await failHeld(runId, { reason: 'not_retryable', totals, failureDetail: { reason: 'result_not_stored' }, taskId, hasOutputs: storedOutputs > 0 });
            if (failed.settled) {
              // The trail rode in the rolled-back transaction: what the run did is kept, not that it completed.
              audit.restoreTaken((event) => event.kind !== 'completed');
              audit.record({ kind: 'failed', meta: { reason: 'not_retryable', detail: 'result_not_stored' } });
              await audit.flush(pool);
            }
            return failed;
          });
          if (!settled.settled) return { kind: 'stopped', why: lease.loss ?? 'lease_lost' };
          return { kind: 'settled', status: settled.run.status as 'completed' | 'failed', reason: settled.run.termination_reason ?? result.reason };
        }
        case 'fail': {
          audit.record({ kind: 'failed', meta: { reason: result.reason, ...result.detail } });
          await audit.flush(pool);
          const settled = await failHeld(runId, {
            reason: result.reason,
            errorClass: result.errorClass ?? null,
            failureDetail: result.detail,
            totals,
            taskId: run!.task_id,
            hasOutputs: storedOutputs > 0,
          });
          if (!settled.settled) return { kind: 'stopped', why: lease.loss ?? 'lease_lost' };
          return { kind: 'settled', status: 'failed', reason: result.reason };
        }
        case 'suspend': {
          // What the turn did is stored now; the suspension's own event only with the suspension, so
          // the timeline never shows a wait that was not stored (`keel runs show` offers it for a decision).
          await audit.flush(pool);
          const suspendedEvent = {
            kind: 'suspended',
            meta: {
              status: result.status,
              ...(state.pendingApproval
                ? {
                    digest: state.pendingApproval.digest,
                    pending: state.pendingApproval.kind === 'tools' ? state.pendingApproval.calls.map((call) => call.name) : [`guardrail:${state.pendingApproval.guardrail}`],
                  }
                : {}),
              ...(state.pendingInput ? { tool: state.pendingInput.toolName } : {}),
            },
          };
          try {
            const suspended = await pool.transaction(async (transaction) => {
              const row = await suspendRun(transaction, sealer, runId, workerId, result.status, { ...state, resume: null }, totals, result.dueAt);
              if (row) {
                audit.recordWithin(transaction, suspendedEvent);
                await audit.flushWithin(transaction);
              }
              // The INPUT_REQUIRED prompt is the task's status message while it waits, and part of its history.
              if (row?.task_id && state.pendingInput) {
                await recordAgentStatusMessage(transaction, sealer, row.task_id, row.answer_level, {
                  messageId: `${row.task_id}-input-${row.revision}`,
                  role: 'ROLE_AGENT',
                  parts: [{ text: state.pendingInput.prompt }],
                  taskId: row.task_id,
                });
              }
              return row;
            });
            afterCommit(runId);
            if (!suspended) return { kind: 'stopped', why: lease.loss ?? 'lease_lost' };
            if (state.pendingDependency) onDependencyWait(state.pendingDependency.dependencyId);
            if (result.dueAt !== undefined) {
              // The wake-up at the due time; the sweep restores it if it is lost.
              const dueAt = result.dueAt;
              await context.queues
                .addJob('runs', timerJobId(runId, suspended.revision), { runId }, { delayMs: Math.max(0, dueAt - Date.now()) })
                .catch((error: Error) => runLog.warn({ err: error }, 'the timer wake-up could not be added; the sweeper adds it'));
            }
            return { kind: 'suspended', status: result.status };
          } catch (error) {
            if (isConnectionError(error)) throw error;
            // A suspension that cannot be stored fails the run rather than promise a decision.
            runLog.error({ err: error }, 'the suspended turn could not be stored; failing the run');
            const reason = result.status === 'waiting_for_approval' ? 'approval_denied' : 'not_retryable';
            const failed = await failHeld(runId, {
              reason,
              totals,
              failureDetail: { reason: 'suspension_not_stored', status: result.status },
              taskId: run!.task_id,
              hasOutputs: storedOutputs > 0,
            });
            if (failed.settled) {
              audit.restoreTaken((event) => event.kind !== 'suspended');
              audit.record({ kind: 'failed', meta: { reason, detail: 'suspension_not_stored', status: result.status } });
              await audit.flush(pool);
            }
            return { kind: 'settled', status: 'failed', reason };
          }
        }
      }
    }
  }

  async function drain(graceMs: number): Promise<{ finished: number; released: number }> {
    draining = true;
    const before = inFlight.size;
    const all = Promise.all([...inFlight.values()].map((entry) => entry.done));
    await Promise.race([all, new Promise((resolve) => setTimeout(resolve, graceMs).unref())]);
    const remaining = [...inFlight.values()];
    for (const entry of remaining) entry.lease?.release();
    await Promise.all(remaining.map((entry) => entry.done));
    return { finished: before - remaining.length, released: remaining.length };
  }

  return {
    execute,
    drain,
    processor: (job) => execute(job.data.runId),
    fastRuns,
    queueDrained: () => {
      queueBacklogUntil = 0;
    },
  };
}
