import { randomBytes } from 'node:crypto';
import { Ajv } from 'ajv';
import type { CommonQueryMethods, DatabasePool } from 'slonik';
import type { LoopState, PendingApproval, ResumeInput } from '../../machines/agent-loop.machine.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import type { Sealer } from '../sealing/sealer.js';
import { handoffJobId } from '../queue/job-ids.js';
import { claimForResume, getRun, HANDOFF_PREFIX, suspendedStateContext, type SuspendStatus } from './run-repository.js';
import type { RunRow } from './run-row.js';

// Resuming a suspended run from outside a worker (CLI, operator UI, an A2A follow-up message):
// the decision is checked against what is pending, then one guarded claimForResume hands the run
// to a worker (claimed_by 'handoff:<nonce>') with the decision sealed into its suspended state,
// and the run's job is enqueued. Two deciders cannot both win the claim.

/** A handoff not taken by a worker within this time is requeued by the reaper. */
export const HANDOFF_LEASE_MS = 60_000;

export type SuspendedView = { run: RunRow; state: LoopState };

export type ReadSuspendedResult =
  | { ok: true; view: SuspendedView }
  | { ok: false; reason: 'not_found' }
  | { ok: false; reason: 'not_waiting'; status: string }
  | { ok: false; reason: 'unreadable'; detail: string };

export async function readSuspendedRun(pool: DatabasePool, sealer: Sealer, runId: string, status: SuspendStatus): Promise<ReadSuspendedResult> {
  const run = await getRun(pool, runId);
  if (!run) return { ok: false, reason: 'not_found' };
  if (run.status !== status) return { ok: false, reason: 'not_waiting', status: run.status };
  if (!run.suspended_state) return { ok: false, reason: 'unreadable', detail: 'no suspended state stored' };
  const opened = sealer.openJson<LoopState>(suspendedStateContext(runId), run.suspended_state);
  if (!opened.ok) return { ok: false, reason: 'unreadable', detail: `suspended state cannot be opened (${opened.reason})` };
  return { ok: true, view: { run, state: opened.value } };
}

export type DecideResult =
  | { ok: true; run: RunRow }
  | { ok: false; reason: 'not_found' | 'stale_digest' | 'already_decided' }
  | { ok: false; reason: 'not_waiting'; status: string }
  | { ok: false; reason: 'unreadable'; detail: string };

type ResumeDeps = { pool: DatabasePool; sealer: Sealer; queues: KeelQueues };

/**
 * Writes that belong to the hand-off (an A2A follow-up's reply in the task's history): they run in
 * the transaction of the claim, after it, so they commit with it or not at all, and before any
 * worker can take the run. False declines the hand-off: nothing of it is committed.
 */
export type WithHandOff = (transaction: CommonQueryMethods, claimed: RunRow) => Promise<boolean>;

type HandOffResult = { kind: 'claimed'; run: RunRow } | { kind: 'lost' } | { kind: 'declined' };

/**
 * The wake-up of a run handed to a worker, after the commit of its claim: under the hand-off's own
 * id (job-ids.ts), which the sweeper also uses to restore it, never under the run's usual id that
 * the job of the stretch that suspended may still hold.
 */
export async function enqueueHandOff(queues: KeelQueues, claimed: Pick<RunRow, 'id' | 'revision'>): Promise<void> {
  await queues.addJob('runs', handoffJobId(claimed.id, claimed.revision), { runId: claimed.id });
}

/** Rolls the hand-off's transaction back when its companion writes decline it. */
class HandOffDeclined extends Error {}

async function handOff(
  deps: ResumeDeps,
  view: SuspendedView,
  status: SuspendStatus,
  resume: ResumeInput,
  requestMetadata?: Record<string, unknown>,
  withHandOff?: WithHandOff,
): Promise<HandOffResult> {
  const handoff = { workerId: `${HANDOFF_PREFIX}${randomBytes(8).toString('hex')}`, leaseMs: HANDOFF_LEASE_MS };
  const claim = (db: CommonQueryMethods) =>
    claimForResume(db, view.run.id, status, handoff, view.run.revision, {
      sealer: deps.sealer,
      state: { ...view.state, resume, ...(requestMetadata ? { requestMetadata: { ...view.state.requestMetadata, ...requestMetadata } } : {}) },
    });
  let claimed: RunRow | null;
  try {
    claimed = withHandOff
      ? await deps.pool.transaction(async (transaction) => {
          const run = await claim(transaction);
          if (run && !(await withHandOff(transaction, run))) throw new HandOffDeclined();
          return run;
        })
      : await claim(deps.pool);
  } catch (error) {
    if (error instanceof HandOffDeclined) return { kind: 'declined' };
    throw error;
  }
  if (!claimed) return { kind: 'lost' };
  // Enqueued after the commit: the worker finds the claim and everything written with it.
  await enqueueHandOff(deps.queues, claimed);
  return { kind: 'claimed', run: claimed };
}

/**
 * An operator's approval or denial of the pending turn. The digest must be the one shown for the
 * turn that is pending now; a stale digest is refused and nothing changes.
 */
export async function decideApproval(deps: ResumeDeps, runId: string, digest: string, approved: boolean): Promise<DecideResult> {
  const read = await readSuspendedRun(deps.pool, deps.sealer, runId, 'waiting_for_approval');
  if (!read.ok) return read;
  const pending: PendingApproval | null = read.view.state.pendingApproval;
  if (!pending || pending.digest !== digest.trim().toLowerCase()) return { ok: false, reason: 'stale_digest' };
  const handed = await handOff(deps, read.view, 'waiting_for_approval', { kind: 'approval', approved, digest: pending.digest });
  return handed.kind === 'claimed' ? { ok: true, run: handed.run } : { ok: false, reason: 'already_decided' };
}

export type ProvideInputResult =
  | { ok: true; run: RunRow }
  | { ok: false; reason: 'not_found' | 'already_decided' | 'declined' }
  | { ok: false; reason: 'not_waiting'; status: string }
  | { ok: false; reason: 'unreadable'; detail: string }
  | { ok: false; reason: 'invalid_input'; errors: string };

const ajv = new Ajv({ allErrors: true, strict: false });

/**
 * Typed input for a run waiting for it; input that does not match the tool's schema leaves it
 * waiting. `requestMetadata` (the A2A messageId of the follow-up) replaces the matching keys of what
 * the providers are given from then on; `withHandOff` writes what goes with the input in the
 * transaction that hands the run over ('declined' when it refuses: the run still waits).
 */
export async function provideRunInput(
  deps: ResumeDeps,
  runId: string,
  value: unknown,
  requestMetadata?: Record<string, unknown>,
  withHandOff?: WithHandOff,
): Promise<ProvideInputResult> {
  const read = await readSuspendedRun(deps.pool, deps.sealer, runId, 'waiting_for_input');
  if (!read.ok) return read;
  const pending = read.view.state.pendingInput;
  if (!pending) return { ok: false, reason: 'unreadable', detail: 'no pending input request stored' };
  const validate = ajv.compile(pending.schema);
  if (!validate(value)) return { ok: false, reason: 'invalid_input', errors: ajv.errorsText(validate.errors) };
  const handed = await handOff(deps, read.view, 'waiting_for_input', { kind: 'input', value }, requestMetadata, withHandOff);
  if (handed.kind === 'claimed') return { ok: true, run: handed.run };
  return { ok: false, reason: handed.kind === 'declined' ? 'declined' : 'already_decided' };
}
