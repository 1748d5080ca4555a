import type { DatabasePool } from 'slonik';
import type { ModelStepResult } from '../../machines/agent-loop.machine.js';
import type { ChainLink } from '../agents/agent-registry.js';
import { answerIsRetainable, ceilingTightened, tightenCeilings, type Ceilings } from '../privacy/resolve-ceilings.js';
import { isRetryableClass, type ProviderCallInput, type ProviderFailure, type ProviderReply, type ToolSpec } from '../providers/provider.js';
import type { Sealer } from '../sealing/sealer.js';
import type { AuditTrail } from './audit-trail.js';
import type { LeaseKeeper } from './lease-keeper.js';
import { deleteRunOutputs, scrubRunOutputs } from './run-output-repository.js';
import { lockHeldRun, switchRunProvider, type Db, type Holder } from './run-repository.js';
import { started as startedStep, unlessCancelled, type DiscardLate, type LateOutcome, type Raced } from './unless-cancelled.js';
import { inModelCallSpan } from '../tracing/gen-ai-spans.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';

// An agent's provider chain as one model call of a run sees it: which provider is asked, how often
// a failure is retried, when the next provider takes over, and what a fallback's privacy ceilings
// do to what the run already stored (docs/architecture.md, "Privacy"). The executor supplies the
// run (lease, audit trail, the switch's transaction); the chain decides.

/** How a failed attempt is retried on the same provider (the `runs` config section). */
export type RetryPolicy = {
  providerAttempts: number;
  providerBackoffMs: number;
  /** Longest wait before a provider retry, Retry-After included. */
  maxBackoffMs: number;
};

type StopStep = Extract<ModelStepResult, { kind: 'stop' }>;
type FailedStep = Extract<ModelStepResult, { kind: 'failed' }>;

/** What the chain answered for one model call; the executor turns a reply into the loop's step. */
export type ChainAnswer = { kind: 'reply'; reply: ProviderReply; providerIndex: number } | FailedStep | StopStep;

/** The outcome of a switch to another provider: applied, refused (the run is no longer held), or fatal to a task. */
export type ProviderSwitch = 'applied' | 'lost' | 'not_retainable';

/**
 * What a switch to a provider does to what the run stored: nothing, every stored answer rewritten
 * down to a tightened answer ceiling, or, for an A2A task whose answer ceiling no longer lets a
 * result be kept, every stored content removed.
 */
export type StoredAnswers = 'kept' | 'tightened' | 'not_retainable';

export type CeilingChange = { current: Ceilings; next: Ceilings; answers: StoredAnswers };

/** The link whose ceilings the run row carries: the one it names, else the primary. */
export function appliedLinkIndex(chain: readonly ChainLink[], provider: string | null): number {
  const index = chain.findIndex((link) => link.provider.name === provider);
  return index < 0 ? 0 : index;
}

/** The ceilings a switch to a provider leaves the run with (each only tightens), and what they do to stored answers. */
export function planCeilingChange(current: Ceilings, provider: Ceilings, servesTask: boolean): CeilingChange {
  const next = tightenCeilings(current, provider);
  const answers: StoredAnswers =
    servesTask && !answerIsRetainable(next.answerLevel) ? 'not_retainable' : ceilingTightened(current.answerLevel, next.answerLevel) ? 'tightened' : 'kept';
  return { current, next, answers };
}

/** Whether a failed attempt is tried again on the same provider; otherwise the next provider takes over. */
export function retriesOnSameProvider(failure: ProviderFailure, attempt: number, policy: RetryPolicy): boolean {
  return isRetryableClass(failure.class) && attempt < policy.providerAttempts;
}

/** The wait before retry `attempt + 1`: doubling from the base, at least what Retry-After asked, at most the maximum. */
export function retryDelayMs(failure: ProviderFailure, attempt: number, policy: RetryPolicy): number {
  return Math.min(policy.maxBackoffMs, Math.max(failure.retryAfterMs ?? 0, policy.providerBackoffMs * 2 ** (attempt - 1)));
}

/** The run's failure once every provider of the chain failed: retryable by a caller only if the last failure was. */
export function chainExhausted(chain: readonly ChainLink[], lastFailure: ProviderFailure | null): FailedStep {
  const failure = lastFailure ?? { class: 'unknown' as const, message: 'no provider configured' };
  return {
    kind: 'failed',
    reason: isRetryableClass(failure.class) ? 'provider_failed' : 'not_retryable',
    errorClass: failure.class,
    detail: { provider: chain[chain.length - 1]!.provider.name, class: failure.class, status: failure.status ?? null },
  };
}

/** A fallback whose ceilings leave a task no retainable result fails the run. */
function notRetainable(link: ChainLink): FailedStep {
  return { kind: 'failed', reason: 'result_not_retainable', errorClass: 'privacy', detail: { provider: link.provider.name, answerLevel: link.ceilings.answerLevel } };
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (ms <= 0 || signal.aborted) return resolve();
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
  });

/** The run a chain serves, as the executor holds it. */
export type ChainRun = {
  runId: string;
  chain: readonly ChainLink[];
  tools: readonly ToolSpec[];
  policy: RetryPolicy;
  audit: AuditTrail;
  lease: Pick<LeaseKeeper, 'loss' | 'abort' | 'cancelled'>;
  /** Applies link `index`'s ceilings to the run before its first attempt (see `applyLinkCeilings`). */
  switchTo: (index: number) => Promise<ProviderSwitch>;
  /** Takes a provider's answer that came after the run was cancelled: discarded, never applied. */
  discard?: DiscardLate;
  /** Told which provider the run is waiting for (null once it answered), for a cancel's timeline event. */
  calling?: (provider: string | null) => void;
};

/** One model call's input: where in the chain the loop stands, and the turn so far. */
export type ChainRequest = Pick<ProviderCallInput, 'iteration' | 'transcript' | 'requestMetadata'> & { providerIndex: number };

export type ProviderChain = { call: (request: ChainRequest) => Promise<ChainAnswer> };

/** The provider chain of one run; `appliedIndex` is the link whose ceilings the run row carries. */
export function providerChainOf(run: ChainRun, appliedIndex: number): ProviderChain {
  const { chain, lease, audit, policy } = run;
  let applied = appliedIndex;

  /** Walks the chain from the loop's provider on; each provider's ceilings apply before it is first asked. */
  async function call(request: ChainRequest): Promise<ChainAnswer> {
    let lastFailure: ProviderFailure | null = null;
    for (let index = request.providerIndex; index < chain.length; index += 1) {
      const link = chain[index]!;
      if (index !== applied) {
        const switched = await run.switchTo(index);
        if (switched === 'lost') return { kind: 'stop', why: lease.loss ?? 'lease_lost' };
        applied = index;
        if (switched === 'not_retainable') return notRetainable(link);
      }
      const answer = await askProvider(link, index, request);
      if (answer.kind !== 'exhausted') return answer;
      lastFailure = answer.lastFailure ?? lastFailure;
    }
    return chainExhausted(chain, lastFailure);
  }

  /** Asks one provider, retrying retryable failures with backoff; every attempt goes to the audit trail. */
  async function askProvider(link: ChainLink, index: number, request: ChainRequest): Promise<ChainAnswer | { kind: 'exhausted'; lastFailure: ProviderFailure | null }> {
    let lastFailure: ProviderFailure | null = null;
    for (let attempt = 1; attempt <= policy.providerAttempts; attempt += 1) {
      if (lease.loss) return { kind: 'stop', why: lease.loss };
      const started = Date.now();
      // The provider gets the run's signal (openai's request is aborted with it); a cancel stops
      // the wait at once even for one that ignores it, and its late answer is discarded.
      const ask = () =>
        link.provider.call({
          runId: run.runId,
          iteration: request.iteration,
          transcript: request.transcript,
          tools: run.tools,
          signal: lease.abort.signal,
          ...(request.requestMetadata ? { requestMetadata: request.requestMetadata } : {}),
        });
      const calling = startedStep(() => (tracingEnabled() ? inModelCallSpan(link.provider, { iteration: request.iteration, attempt }, ask) : ask()));
      run.calling?.(link.provider.name);
      let raced: Raced<Awaited<typeof calling>>;
      try {
        raced = await unlessCancelled(calling, lease.cancelled.signal);
      } finally {
        run.calling?.(null);
      }
      if (!raced.done) {
        run.discard?.(
          calling.then(
            (late): LateOutcome => ({ outcome: late.ok ? 'reply' : late.failure.class }),
            (): LateOutcome => ({ outcome: 'error' }),
          ),
          { step: 'model', provider: link.provider.name, iteration: request.iteration, attempt },
        );
        return { kind: 'stop', why: 'cancelled' };
      }
      const outcome = raced.value;
      if (lease.loss) return { kind: 'stop', why: lease.loss };
      if (outcome.ok) {
        const { reply } = outcome;
        audit.record({
          kind: 'model_reply',
          meta: {
            provider: link.provider.name,
            iteration: request.iteration,
            attempt,
            durationMs: Date.now() - started,
            inputTokens: reply.usage.inputTokens,
            outputTokens: reply.usage.outputTokens,
            toolCalls: reply.toolCalls.map((toolCall) => toolCall.name),
            artifacts: reply.artifacts.length,
          },
          content: { text: reply.text, toolCalls: reply.toolCalls },
        });
        return { kind: 'reply', reply, providerIndex: index };
      }
      lastFailure = outcome.failure;
      audit.record({
        kind: 'model_failed',
        meta: { provider: link.provider.name, iteration: request.iteration, attempt, class: outcome.failure.class, status: outcome.failure.status ?? null, durationMs: Date.now() - started },
      });
      if (!retriesOnSameProvider(outcome.failure, attempt, policy)) break;
      await sleep(retryDelayMs(outcome.failure, attempt, policy), lease.abort.signal);
    }
    return { kind: 'exhausted', lastFailure };
  }

  return { call };
}

/**
 * What a tightened answer ceiling does to the A2A task the run serves (its stored content and its
 * journal). The tasks feature does it: it stands above runs/, so the executor passes it in.
 */
export type ScrubServedTask = (transaction: Db, taskId: string, change: CeilingChange) => Promise<void>;

/** The run the switch is for, as its worker holds it. */
export type HeldRun = { runId: string; holder: Holder; taskId: string | null; audit: AuditTrail };

/**
 * Applies a provider's ceilings under the run-row lock, in one transaction with what they do to
 * stored answers: outputs rewritten down to a tightened answer ceiling (the served task's content
 * and journal with them), or, for a task whose result could no longer be kept, every stored
 * content removed ('not_retainable'). A worker that no longer holds the run writes nothing ('lost').
 */
export async function applyLinkCeilings(
  pool: DatabasePool,
  sealer: Sealer,
  run: HeldRun,
  link: ChainLink,
  index: number,
  scrubServedTask: ScrubServedTask,
): Promise<ProviderSwitch> {
  return pool.transaction(async (transaction) => {
    const held = await lockHeldRun(transaction, run.runId, run.holder);
    if (!held) return 'lost';
    const change = planCeilingChange({ auditLevel: held.auditLevel, answerLevel: held.answerLevel }, link.ceilings, run.taskId !== null);
    if (!(await switchRunProvider(transaction, run.runId, run.holder, link.provider.name, change.next))) return 'lost';
    if (change.answers === 'not_retainable') await deleteRunOutputs(transaction, run.runId);
    if (change.answers === 'tightened') await scrubRunOutputs(transaction, sealer, run.runId, change.next.answerLevel);
    if (change.answers !== 'kept' && run.taskId !== null) await scrubServedTask(transaction, run.taskId, change);
    run.audit.setLevel(change.next.auditLevel);
    // Part of this transaction's writes: forgotten if it is undone, so a retry records it once.
    run.audit.recordWithin(transaction, {
      kind: 'provider_selected',
      meta: {
        provider: link.provider.name,
        position: index,
        auditLevel: change.next.auditLevel,
        answerLevel: change.next.answerLevel,
        tightened: change.next.answerLevel !== change.current.answerLevel || change.next.auditLevel !== change.current.auditLevel,
      },
    });
    return change.answers === 'not_retainable' ? 'not_retainable' : 'applied';
  });
}
