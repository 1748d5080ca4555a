import type { LoopOutcome, LoopState } from '../machines/agent-loop.machine.js';
import type { KeelContext } from '../src/context/keel-context.js';
import { DatabaseReturn } from '../src/db/database-return.js';
import { isConnectionError } from '../src/db/pool.js';
import type { ArtifactEmission } from '../src/providers/provider.js';
import { runJobId, timerJobId } from '../src/queue/job-ids.js';
import { outputFromEmission } from '../src/runs/run-output-repository.js';
import { getRun, releaseRun, renewLease, suspendRun, type Holder, type RunTotals } from '../src/runs/run-repository.js';
import { dueOpenDependenciesOfRun } from '../src/remote/dependency-repository.js';
import { recordEndedRunEvent } from '../src/runs/run-event-repository.js';
import { completeRun } from '../src/writes/complete-run.js';
import { failHeldRun } from '../src/writes/uncommon-ends.js';
import type { CompletionInput, CompletionResult, FailureInput } from '../src/writes/completion-input.js';
import { recordAgentStatusMessage } from '../src/tasks/task-repository.js';
import type { AfterCommit, DrivenRun, EndJournaling, ExecutionReport, ExecutorOptions, RunInHand } from './run-execution.js';

// How a run this process holds ends: completed, failed, suspended or stopped, each one guarded
// write of the run repository or one completion transaction. A run's end whose write was lost
// with its connection is written again here as soon as the database answers.

type Outcome<K extends LoopOutcome['kind']> = Extract<LoopOutcome, { kind: K }>;

const totalsOf = (state: LoopState): RunTotals => ({
  iterations: state.iteration,
  toolCalls: state.toolCallCount,
  inputTokens: state.inputTokens,
  outputTokens: state.outputTokens,
});

export type SettlingDeps = {
  context: KeelContext;
  options: ExecutorOptions;
  afterCommit: AfterCommit;
  onDependencyWait: (dependencyId: string) => void;
  endJournaling: EndJournaling;
};

export class RunSettling {
  private readonly databaseReturn: DatabaseReturn;
  /** Aborted at shutdown: a run waiting for the database to answer again stops waiting. */
  private readonly stopWaiting = new AbortController();

  constructor(private readonly deps: SettlingDeps) {
    this.databaseReturn = new DatabaseReturn(deps.context.pool);
  }

  /** Shutdown: no run waits for the database any more. */
  stop(): void {
    this.stopWaiting.abort();
  }

  /** True once the database answers, false after `withinMs` or at shutdown. */
  databaseAnswers(withinMs: number): Promise<boolean> {
    return this.databaseReturn.answers(withinMs, this.stopWaiting.signal);
  }

  /** Settles what the run's drive ended with. */
  async settle(hand: RunInHand, driven: DrivenRun): Promise<ExecutionReport> {
    const { outcome, state } = driven;
    const totals = totalsOf(state);
    switch (outcome.kind) {
      case 'stop':
        return this.stopped(hand, outcome);
      case 'complete':
        return this.completed(hand, outcome, totals, driven.artifacts);
      case 'fail':
        return this.failed(hand, outcome, totals);
      case 'suspend':
        return this.suspended(hand, outcome, state, totals);
    }
  }

  /** The worker's own failure of the run it holds under `holder` (its end journaled with it: settleEnd). */
  failHeld(runId: string, holder: Holder, input: Omit<FailureInput, 'runId' | 'holder' | 'projection'>): Promise<CompletionResult> {
    const { pool, sealer, logger } = this.deps.context;
    const projection = this.deps.options.projection;
    return this.settleEnd(runId, holder, input.taskId, () => failHeldRun(pool, sealer, logger, { ...input, runId, holder, ...(projection ? { projection } : {}) }));
  }

  /**
   * A settle that ends the run (completion or the worker's failure). When its transaction journaled
   * the end, the task as it wrote it goes to this process's waiters once the COMMIT has returned,
   * and no projection is owed; otherwise (nothing journaled, or an error: a COMMIT whose outcome is
   * unknown) the waiters read, and the projector is woken as after any commit.
   */
  private async settleEnd(runId: string, holder: Holder, taskId: string | null, settle: () => Promise<CompletionResult>, again: () => void = () => undefined): Promise<CompletionResult> {
    const { afterCommit, endJournaling } = this.deps;
    const local = taskId === null ? null : endJournaling.begin(runId, taskId);
    let result: CompletionResult;
    try {
      result = await this.settleOnceWritten(runId, holder, settle, again);
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
      await endJournaling.journaled(runId, end).catch((error: Error) => this.deps.context.logger.warn({ err: error, runId }, 'push wake-ups after a journaled end failed; the sweeper adds them'));
    } else {
      afterCommit(runId);
    }
    return result;
  }

  /**
   * Writes a run's end, and writes it again when its connection was lost (a Postgres crash, a cut
   * socket): this process still holds the run, so it does not leave it to its lease and the reaper
   * (a requeue, a SUBMITTED event, a minute or more) but waits for the database to answer, renews
   * the lease and writes the same end under the same claim. A first write that did commit before
   * its connection went is refused by the settle's own guard (the run is no longer running), so
   * nothing is written twice; the caller's waiters then read what is there. `again` gives back
   * what the lost write took (the audit rows). Past one lease without an answer the run is left
   * to the reaper, as a dead process's would be.
   */
  private async settleOnceWritten(runId: string, holder: Holder, settle: () => Promise<CompletionResult>, again: () => void): Promise<CompletionResult> {
    const { pool, logger } = this.deps.context;
    const givesUpAt = Date.now() + this.deps.options.leaseMs;
    for (;;) {
      try {
        return await settle();
      } catch (error) {
        if (!isConnectionError(error) || this.stopWaiting.signal.aborted) throw error;
        logger.warn({ err: error, runId }, "a run's end was not written (the database went away); writing it again once it answers");
        if (!(await this.databaseAnswers(givesUpAt - Date.now()))) throw error;
        await renewLease(pool, runId, { ...holder, leaseMs: this.deps.options.leaseMs }).catch(() => false);
        again();
      }
    }
  }

  private complete(input: CompletionInput): Promise<CompletionResult> {
    const { pool, sealer, logger } = this.deps.context;
    const completions = this.deps.options.completions;
    return completions ? completions.complete(input) : completeRun(pool, sealer, logger, input);
  }

  private async stopped({ runId, holder, audit, lease, cancelledDuring, runLog }: RunInHand, outcome: Outcome<'stop'>): Promise<ExecutionReport> {
    const { pool, queues } = this.deps.context;
    await audit.flush(pool);
    if (lease.loss === 'cancelled') {
      // The cancel settled the run; its worker adds where the cancel found it and how soon the
      // work stopped, after the rest of the trail (decision 0066).
      const during = cancelledDuring ?? { step: 'between_steps' };
      await recordEndedRunEvent(pool, runId, 'cancelled', { ...during, stoppedInMs: Date.now() - lease.lostAt }).catch((error: Error) =>
        runLog.warn({ err: error }, "the cancel's stop could not be recorded in the timeline"),
      );
      // A remote task the run started is cancelled in turn (its dependency's reconcile).
      for (const dependencyId of await dueOpenDependenciesOfRun(pool, runId).catch(() => [])) this.deps.onDependencyWait(dependencyId);
    }
    if (lease.released) {
      const released = await releaseRun(pool, runId, holder);
      if (released) {
        this.deps.afterCommit(runId);
        // The job being processed holds the run's usual id until this returns: the wake-up for
        // another worker needs an id of its own, or BullMQ drops it as a duplicate.
        await queues.addJob('runs', `${runJobId(runId, released.requeue_count)}-v${released.revision}`, { runId }).catch(() => undefined);
      }
    }
    return { kind: 'stopped', why: outcome.why };
  }

  /**
   * The run's end was refused by its guarded write. When a cancel committed first (the cancel won
   * the race with the end), the end is discarded, never applied: the timeline keeps what the run
   * did, not that it ended so, and records the discarded end (decision 0066). When the run's claim
   * changed (its lease expired and the reaper requeued or dead-lettered it), the end and the rest
   * of the trail are refused by the fence, and the drive records the refusal (decision 0088).
   */
  private async endRefused({ runId, holder, fence, audit, runLog, lease }: RunInHand, end: 'completed' | 'failed'): Promise<void> {
    const { pool } = this.deps.context;
    try {
      const run = await getRun(pool, runId);
      if (run !== null && run.claim_token !== holder.token) {
        fence.refuse(end === 'completed' ? 'completion' : 'failure');
        // The trail's rows still buffered are this late claim's too: the fence refuses and counts them.
        audit.restoreTaken();
        await audit.flush(pool);
        return;
      }
      if (run?.status !== 'cancelled') return;
      audit.restoreTaken((event) => event.kind !== end);
      await audit.flush(pool);
      // The cancel found the run writing its end: that is where it stopped.
      await recordEndedRunEvent(pool, runId, 'cancelled', { step: 'end', name: end, stoppedInMs: lease.lostAt === 0 ? 0 : Date.now() - lease.lostAt });
      await recordEndedRunEvent(pool, runId, 'late_result_discarded', { step: 'end', outcome: end });
    } catch (error) {
      runLog.warn({ err: error }, 'a run end refused after its cancel could not be recorded in the timeline');
    }
  }

  /** `resultArtifacts`: artifacts of the result (a statechart's output), written by the completion transaction. */
  private async completed(hand: RunInHand, outcome: Outcome<'complete'>, totals: RunTotals, resultArtifacts: readonly ArtifactEmission[]): Promise<ExecutionReport> {
    const { pool } = this.deps.context;
    const { runId, holder, audit, held, lease, runLog } = hand;
    const projection = this.deps.options.projection;
    audit.record({ kind: 'completed', meta: { reason: outcome.reason, ...totals } });
    const taskId = hand.run.task_id;
    const settled = await this.settleEnd(
      runId,
      holder,
      taskId,
      () =>
        this.complete({
          beforeSettle: (transaction) => audit.flushWithin(transaction),
          resultOutputs: resultArtifacts.map((emission, index) => outputFromEmission('artifact', emission, `output-${index}`)),
          takeAuditRows: (transaction) => audit.takeUnrefusableRows(transaction),
          rolledBack: () => audit.restoreTaken(),
          ...(held ? { held } : {}),
          taskId,
          hasOutputs: hand.storedOutputs > 0 || resultArtifacts.length > 0,
          runId,
          holder,
          reason: outcome.reason,
          answer: outcome.answer,
          ...(outcome.presentation ? { presentation: outcome.presentation } : {}),
          totals,
          ...(projection ? { projection } : {}),
        }),
      // A write lost with its connection gave nothing back: its audit rows ride in the next.
      () => audit.restoreTaken(),
    ).catch(async (error: Error) => {
      // The database out of reach is not the result's fault: the run keeps its claim (its process
      // drives it again once the database answers, or the reaper requeues it when its lease expires).
      if (isConnectionError(error)) throw error;
      runLog.error({ err: error }, 'the result could not be stored; failing the run');
      const failed = await this.failHeld(runId, holder, { reason: 'not_retryable', totals, failureDetail: { reason: 'result_not_stored' }, taskId, hasOutputs: hand.storedOutputs > 0 });
      if (failed.settled) {
        // The trail rode in the rolled-back transaction: what the run did is kept, not that it completed.
        audit.restoreTaken((event) => event.kind !== 'completed');
        audit.record({ kind: 'failed', meta: { reason: 'not_retryable', detail: 'result_not_stored' } });
        await audit.flush(pool);
      }
      return failed;
    });
    if (!settled.settled) {
      await this.endRefused(hand, 'completed');
      return { kind: 'stopped', why: lease.loss ?? 'lease_lost' };
    }
    return { kind: 'settled', status: settled.run.status as 'completed' | 'failed', reason: settled.run.termination_reason ?? outcome.reason };
  }

  private async failed(hand: RunInHand, outcome: Outcome<'fail'>, totals: RunTotals): Promise<ExecutionReport> {
    const { runId, audit, lease } = hand;
    audit.record({ kind: 'failed', meta: { reason: outcome.reason, ...outcome.detail } });
    await audit.flush(this.deps.context.pool);
    const settled = await this.failHeld(runId, hand.holder, {
      reason: outcome.reason,
      errorClass: outcome.errorClass ?? null,
      failureDetail: outcome.detail,
      ...(outcome.statusText === undefined ? {} : { statusText: outcome.statusText }),
      totals,
      taskId: hand.run.task_id,
      hasOutputs: hand.storedOutputs > 0,
    });
    if (!settled.settled) {
      await this.endRefused(hand, 'failed');
      return { kind: 'stopped', why: lease.loss ?? 'lease_lost' };
    }
    return { kind: 'settled', status: 'failed', reason: outcome.reason };
  }

  private async suspended(hand: RunInHand, outcome: Outcome<'suspend'>, state: LoopState, totals: RunTotals): Promise<ExecutionReport> {
    const { pool, sealer, queues } = this.deps.context;
    const { runId, holder, audit, lease, runLog } = hand;
    // What the turn did is stored now; the suspension's own event only with the suspension, so
    // the timeline never shows a wait that was not stored (`keel runs show` offers it for a decision).
    await audit.flush(pool);
    const suspendedEvent = {
      kind: 'suspended',
      meta: {
        status: outcome.status,
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
        const row = await suspendRun(transaction, sealer, runId, holder, outcome.status, { ...state, resume: null }, totals, outcome.dueAt);
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
      this.deps.afterCommit(runId);
      if (!suspended) {
        hand.fence.refuse('suspension');
        return { kind: 'stopped', why: lease.loss ?? 'lease_lost' };
      }
      if (state.pendingDependency) this.deps.onDependencyWait(state.pendingDependency.dependencyId);
      if (outcome.dueAt !== undefined) {
        // The wake-up at the due time; the sweep restores it if it is lost.
        const dueAt = outcome.dueAt;
        await queues
          .addJob('runs', timerJobId(runId, suspended.revision), { runId }, { delayMs: Math.max(0, dueAt - Date.now()) })
          .catch((error: Error) => runLog.warn({ err: error }, 'the timer wake-up could not be added; the sweeper adds it'));
      }
      return { kind: 'suspended', status: outcome.status };
    } catch (error) {
      if (isConnectionError(error)) throw error;
      // A suspension that cannot be stored fails the run rather than promise a decision.
      runLog.error({ err: error }, 'the suspended turn could not be stored; failing the run');
      const reason = outcome.status === 'waiting_for_approval' ? 'approval_denied' : 'not_retryable';
      const failed = await this.failHeld(runId, holder, {
        reason,
        totals,
        failureDetail: { reason: 'suspension_not_stored', status: outcome.status },
        taskId: hand.run.task_id,
        hasOutputs: hand.storedOutputs > 0,
      });
      if (failed.settled) {
        audit.restoreTaken((event) => event.kind !== 'suspended');
        audit.record({ kind: 'failed', meta: { reason, detail: 'suspension_not_stored', status: outcome.status } });
        await audit.flush(pool);
      }
      return { kind: 'settled', status: 'failed', reason };
    }
  }
}
