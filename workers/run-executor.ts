import { agentLoopMachine, freshLoopState, type LoopState } from '../machines/agent-loop.machine.js';
import { createMachineStepper } from '../machines/step-machine.js';
import type { AgentRegistry, RegisteredAgent } from '../src/agents/agent-registry.js';
import type { KeelContext } from '../src/context/keel-context.js';
import { isConnectionError, type DatabasePool } from '../src/db/pool.js';
import type { GuardedFetch } from '../src/net/guarded-fetch.js';
import type { TranscriptMessage } from '../src/providers/provider.js';
import { runJobId } from '../src/queue/job-ids.js';
import { AuditTrail } from '../src/runs/audit-trail.js';
import type { FastRun, FastRuns } from '../src/runs/fast-runs.js';
import { LeaseKeeper } from '../src/runs/lease-keeper.js';
import { applyLinkCeilings, appliedLinkIndex, providerChainOf, type ProviderChain, type ScrubServedTask } from '../src/runs/provider-chain.js';
import {
  claimDueTimer,
  claimQueuedRun,
  holderOf,
  newClaimToken,
  queuedRequestContext,
  reclaimHeldRun,
  releaseRun,
  suspendedStateContext,
  takeOverHandoff,
  type Holder,
  type NewClaim,
} from '../src/runs/run-repository.js';
import { LateWriteFence } from '../src/runs/late-write-fence.js';
import { recordEndedRunEvent } from '../src/runs/run-event-repository.js';
import { runRequestSchema, type RunRequest } from '../src/runs/run-request.js';
import type { DiscardLate } from '../src/runs/unless-cancelled.js';
import { isFirstClaim, type RunRow } from '../src/runs/run-row.js';
import type { Sealer } from '../src/sealing/sealer.js';
import { scrubTaskJournal } from '../src/tasks/journal.js';
import { clearStatusMessage, scrubTaskContent, tightenTaskContent } from '../src/tasks/task-repository.js';
import { heldRowsOf, insertedRunRow } from './fast-run-rows.js';
import {
  NO_END_JOURNALING,
  type AfterCommit,
  type DrivenRun,
  type EndJournaling,
  type ExecutionReport,
  type ExecutorOptions,
  type RunExecutor,
  type RunInHand,
  type RunningStepName,
} from './run-execution.js';
import { RunSettling } from './run-settling.js';
import { RunSlots, type Slot } from './run-slots.js';
import { driveRun, ToolValidators } from './run-steps.js';
import { inRunStretch } from '../src/tracing/run-trace.js';
import { tracingEnabled } from '../src/tracing/tracing-switch.js';

export type { AfterCommit, EndJournaling, ExecutionReport, ExecutorOptions, RunExecutor } from './run-execution.js';

// The runs queue's processor: claims a run, rebuilds it from its sealed request (or suspended
// turn), steps the agent loop machine through its pure transitions, and settles, suspends or
// stops. Its parts: the slot scheduler (run-slots.ts), a fast run's rows (fast-run-rows.ts), the
// drive (run-steps.ts) and the settling (run-settling.ts); this file wires them and holds a run
// from its claim to its end. Every write is one of the run repository's guarded transitions; a
// worker that lost its lease writes nothing.

/** How many times a run whose write was lost with the database is driven again by its own process before it is left to the reaper. */
const MAX_REDRIVES = 3;

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

/** Rebuilds the loop state from the durable row: a suspended turn if there is one, else the request. */
function rebuild(sealer: Sealer, run: RunRow, agent: RegisteredAgent, inserted: RunRequest | null): { ok: true; state: LoopState } | { ok: false; detail: string } {
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

/**
 * A statechart run whose timer is due: taken from its wait with the claim, and a prompt it was
 * asking stops being its task's status message in the same transaction (run row first, then task).
 */
const claimTimedOutWait = (pool: DatabasePool, claim: NewClaim, runId: string) =>
  pool.transaction(async (transaction) => {
    const row = await claimDueTimer(transaction, runId, claim);
    if (row?.task_id) await clearStatusMessage(transaction, row.task_id);
    return row;
  });

/** The run a `runs` job woke, claimed for this worker: queued, handed off, or waiting on a timer now due; null when another has it. */
const claimWoken = async (pool: DatabasePool, claim: NewClaim, runId: string) =>
  (await claimQueuedRun(pool, runId, claim)) ?? (await takeOverHandoff(pool, runId, claim)) ?? (await claimTimedOutWait(pool, claim, runId));

/** What a run's lease keeper and provider chain need of the executor. */
type ChainDeps = { pool: DatabasePool; sealer: Sealer; options: ExecutorOptions; afterCommit: AfterCommit; scrubServedTask: ScrubServedTask };

/** What the run's steps tell of themselves: which one is waited for, and a late answer to discard. */
type StepWatch = { calling: (step: RunningStepName | null) => void; discard: DiscardLate };

/** The run's lease keeper, started, and its provider chain, which applies a fallback's ceilings with the scrub of what they no longer allow. */
function leaseAndChain(
  deps: ChainDeps,
  run: RunRow,
  holder: Holder,
  agent: RegisteredAgent,
  audit: AuditTrail,
  slot: Slot,
  runLog: RunInHand['runLog'],
  watch: StepWatch,
): { lease: LeaseKeeper; providerChain: ProviderChain } {
  const { pool, sealer, options, afterCommit } = deps;
  const runId = run.id;
  const lease = new LeaseKeeper(pool, runId, holder, options.leaseMs, options.heartbeatMs, runLog);
  // A long step (a slow provider call) does not hold the audit trail back past one heartbeat.
  lease.onBeat = () => void audit.flushIfDue(pool, options.heartbeatMs);
  lease.start();
  slot.lease = lease;
  const providerChain = providerChainOf(
    {
      runId,
      chain: agent.chain,
      tools: [...agent.tools.values()].map((tool) => ({ name: tool.name, description: tool.description, parameters: tool.parameters })),
      policy: options,
      audit,
      lease,
      discard: watch.discard,
      calling: (provider) => watch.calling(provider === null ? null : { step: 'model', name: provider }),
      switchTo: async (index) => {
        const switched = await applyLinkCeilings(pool, sealer, { runId, holder, taskId: run.task_id, audit }, agent.chain[index]!, index, deps.scrubServedTask);
        afterCommit(runId);
        return switched;
      },
    },
    appliedLinkIndex(agent.chain, run.provider),
  );
  return { lease, providerChain };
}

/**
 * The run's audit trail (new on a first claim, else continued after its stored rows), with the
 * claim or resumption recorded, and the decision or input a resumption brings.
 */
async function openTrail(pool: DatabasePool, run: RunRow, state: LoopState, how: { fresh: boolean; holder: Holder; fastPath: boolean; redriven: boolean }, runLog: RunInHand['runLog']): Promise<AuditTrail> {
  const audit = how.fresh ? new AuditTrail(run.id, run.audit_level, 0, runLog) : await AuditTrail.open(pool, run.id, run.audit_level, runLog);
  audit.record({
    kind: run.suspended_state ? 'resumed' : 'claimed',
    meta: { worker: how.holder.workerId, claim: how.holder.token, revision: run.revision, requeues: run.requeue_count, ...(how.fastPath ? { fastPath: true } : {}), ...(how.redriven ? { redriven: true } : {}) },
  });
  const resume = state.resume;
  if (resume?.kind === 'approval') {
    audit.record({ kind: 'approval_decided', meta: { approved: resume.approved, digest: resume.digest, pending: state.pendingApproval?.kind ?? null } });
  } else if (resume?.kind === 'input') {
    audit.record({ kind: 'input_received', meta: { tool: state.pendingInput?.toolName ?? null }, content: { value: resume.value } });
  }
  return audit;
}

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
  const claim = { workerId, leaseMs: options.leaseMs };
  const settling = new RunSettling({ context, options, afterCommit, onDependencyWait, endJournaling });
  const slots = new RunSlots(options);
  const tools = new ToolValidators();
  const chainDeps: ChainDeps = { pool, sealer, options, afterCommit, scrubServedTask: scrubServedTaskWith(sealer) };
  // The agent loop runs without an actor per run: the stepper computes each macrostep with the
  // machine's pure transition and runs the step its new state invokes (decision 0023). Made once,
  // it refuses here, at start, a machine with effects it could not carry out.
  const loopStepper = createMachineStepper(agentLoopMachine);

  /** Runs this process is driving: a claim made again after a lost connection must not drive one twice. */
  const driving = new Set<string>();
  /** The lease of each run this process drives now: a cancel NOTIFYd for one renews it at once, and the refused renewal stops its work. */
  const leases = new Map<string, LeaseKeeper>();
  options.cancelNotices?.((runId) => {
    if (runId === null) for (const lease of leases.values()) void lease.renew();
    else void leases.get(runId)?.renew();
  });

  /**
   * A step's answer that came after its run was cancelled: recorded in the run's timeline once the
   * run's stop is written (never applied: the run is no longer held, and every write is guarded),
   * and a remote task it started is cancelled in turn through its dependency's reconcile.
   */
  const discarderFor =
    (runId: string, lease: LeaseKeeper, ended: Promise<void>, runLog: RunInHand['runLog']): DiscardLate =>
    (late, meta) =>
      void (async () => {
        const answer = await late;
        const afterCancelMs = Date.now() - lease.lostAt;
        await ended;
        await recordEndedRunEvent(pool, runId, 'late_result_discarded', { ...meta, outcome: answer.outcome, afterCancelMs });
        if (answer.dependencyId) onDependencyWait(answer.dependencyId);
      })().catch((error: Error) => runLog.warn({ err: error }, 'a late result was discarded but could not be recorded in the timeline'));

  /**
   * The claim, made again once the database answers when its connection was lost: a claim that
   * did commit unseen made the run this worker's (found with its lease renewed), else the claim
   * is tried again. Left to the queue's retry and the reaper past one lease or three tries.
   */
  async function claimOnceWritten(runId: string): Promise<RunRow | null> {
    for (let attempt = 0; ; attempt += 1) {
      // The token this attempt stamps, chosen here: a claim that committed unseen is found by it.
      const attempted = { ...claim, token: newClaimToken() };
      try {
        return await claimWoken(pool, attempted, runId);
      } catch (error) {
        if (!isConnectionError(error) || slots.isDraining || attempt >= MAX_REDRIVES) throw error;
        if (!(await settling.databaseAnswers(options.leaseMs))) throw error;
        if (driving.has(runId)) return null;
        const mine = await reclaimHeldRun(pool, runId, attempted).catch(() => null);
        if (mine) return mine;
      }
    }
  }

  function execute(runId: string, owner?: string): Promise<ExecutionReport> {
    return slots.queued(runId, async (slot) => {
      const run = await claimOnceWritten(runId);
      if (!run) return { kind: 'skipped' };
      afterCommit(runId, true);
      options.onRunStarted?.('queue');
      return executeHeld(run, slot, null);
    }, owner);
  }

  const fastRuns: FastRuns = {
    reserve: (owner) =>
      slots.reserveFast(
        claim,
        {
          run: async (run, slot) => {
            options.onRunStarted?.('fast');
            await executeHeld(insertedRunRow(run, workerId, options.leaseMs), slot, run).catch((error: Error) =>
              logger.error({ err: error, runId: run.id }, 'fast run stopped; its lease expires and the reaper requeues it'),
            );
          },
          handBack: (run) =>
            releaseRun(pool, run.id, { workerId, token: run.claimToken })
              .then(async (released) => void (released && (await context.queues.addJob('runs', runJobId(run.id), { runId: run.id }))))
              .catch((error: Error) => logger.warn({ err: error, runId: run.id }, 'a fast run could not be handed back at shutdown; its lease expires and the reaper requeues it')),
        },
        owner,
      ),
  };

  /**
   * Runs a claimed run; when the database went away under it (a write of the run lost with its
   * connection: a crash, a cut socket), drives it again from its stored row as soon as the
   * database answers, in the same slot and under the same claim, its lease renewed: no requeue, no
   * SUBMITTED event, no wait for the lease to run out. The reaper stays for the runs of a process
   * that died. A run no longer held (settled by a write that did commit, requeued, cancelled) is
   * not driven again, nor one that was inside a non-idempotent tool call (the reaper dead-letters it).
   */
  async function executeHeld(run: RunRow, slot: Slot, fast: FastRun | null): Promise<ExecutionReport> {
    driving.add(run.id);
    try {
      return await executeHeldRun(run, slot, fast);
    } finally {
      driving.delete(run.id);
    }
  }

  async function executeHeldRun(run: RunRow, slot: Slot, fast: FastRun | null): Promise<ExecutionReport> {
    let current = run;
    for (let redriven = 0; ; redriven += 1) {
      try {
        const stretch = () => executeClaimed(current, slot, redriven === 0 ? fast : null, redriven > 0);
        // One span per stretch, parented to the run's stored span (src/tracing/run-trace.ts).
        return await (tracingEnabled() ? inRunStretch(current, workerId, stretch) : stretch());
      } catch (error) {
        if (!isConnectionError(error) || slots.isDraining || redriven >= MAX_REDRIVES) throw error;
        logger.warn({ err: error, runId: run.id }, 'the run lost a write with the database; driving it again once it answers');
        if (!(await settling.databaseAnswers(options.leaseMs))) throw error;
        const holder = holderOf(current);
        const held = holder && (await reclaimHeldRun(pool, run.id, { ...holder, leaseMs: options.leaseMs }).catch(() => null));
        if (!held || held.inside_non_idempotent_call !== null) throw error;
        current = held;
      }
    }
  }

  async function executeClaimed(run: RunRow, slot: Slot, fast: FastRun | null, redriven: boolean): Promise<ExecutionReport> {
    const runId = run.id;
    const insertedRequest = fast?.request ?? null;
    const runLog = logger.child({ runId, agent: run.agent });

    // A run claimed for the first time has no audit rows and no stored outputs yet (driven again,
    // it may have both from its first drive).
    const fresh = !redriven && isFirstClaim(run);
    const holder = holderOf(run);
    if (holder === null) {
      // A row claimed before claims carried tokens (sql/0031): left to its lease and the reaper.
      runLog.warn('a claimed run has no claim token; it is left to its lease');
      return { kind: 'skipped' };
    }
    const agent = registry.get(run.agent);
    if (!agent) {
      await settling.failHeld(runId, holder, { reason: 'not_retryable', failureDetail: { reason: 'unknown_agent', agent: run.agent }, taskId: run.task_id, hasOutputs: !fresh });
      return { kind: 'settled', status: 'failed', reason: 'not_retryable' };
    }
    const rebuilt = rebuild(sealer, run, agent, insertedRequest);
    if (!rebuilt.ok) {
      await settling.failHeld(runId, holder, { reason: 'not_retryable', failureDetail: { reason: rebuilt.detail }, taskId: run.task_id, hasOutputs: !fresh });
      return { kind: 'settled', status: 'failed', reason: 'not_retryable' };
    }

    const audit = await openTrail(pool, run, rebuilt.state, { fresh, holder, fastPath: insertedRequest !== null, redriven }, runLog);
    // Every write of this drive carries its claim; what the fence refuses is recorded when the drive ends.
    const fence = new LateWriteFence(runId, holder);
    audit.fenceWith(holder.token, (rows) => fence.refuse('audit_rows', rows));
    let markEnded = () => undefined as void;
    const ended = new Promise<void>((resolve) => (markEnded = resolve));
    let discard: DiscardLate = () => undefined;
    const watch: StepWatch = { calling: (step) => (hand.current = step), discard: (late, meta) => discard(late, meta) };
    const { lease, providerChain } = leaseAndChain(chainDeps, run, holder, agent, audit, slot, runLog, watch);
    discard = discarderFor(runId, lease, ended, runLog);
    const hand: RunInHand = {
      run,
      runId,
      holder,
      fence,
      agent,
      audit,
      lease,
      runLog,
      held: heldRowsOf(fast, agent),
      // A resumed or requeued run may have stored artifacts before: then completion reads them.
      storedOutputs: fresh ? 0 : 1,
      current: null,
      cancelledDuring: null,
    };
    // Where the cancel found the run, for its timeline: the step it waited for, or none.
    lease.cancelled.signal.addEventListener('abort', () => (hand.cancelledDuring = hand.current ?? { step: 'between_steps' }), { once: true });
    leases.set(runId, lease);
    try {
      let driven: DrivenRun;
      try {
        driven = await driveRun({ hand, pool, sealer, fetch, afterCommit, tools, providerChain, discard: watch.discard, maxArtifactBytes: context.config.a2a.maxArtifactBytes }, rebuilt.state, loopStepper);
      } catch (error) {
        if (!isConnectionError(error)) runLog.error({ err: error }, 'the run crashed; it stays claimed until its lease expires');
        throw error;
      } finally {
        lease.stop();
        if (leases.get(runId) === lease) leases.delete(runId);
      }
      return await settling.settle(hand, driven);
    } finally {
      markEnded();
      // The run was taken over while this drive held it: what the fence refused goes into its timeline.
      if (fence.anyRefused) void fence.record(pool, runLog).catch((error: Error) => runLog.warn({ err: error }, 'late writes refused by the fence could not be recorded in the timeline'));
    }
  }

  return {
    execute,
    drain: (graceMs) => {
      settling.stop();
      return slots.drain(graceMs);
    },
    processor: (job) => execute(job.data.runId, job.data.owner),
    keptFreeSlots: () => slots.keptFree,
    fastRuns,
    queueDrained: () => slots.queueDrained(),
  };
}
