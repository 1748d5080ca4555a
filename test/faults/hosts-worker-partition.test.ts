import { sql } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { BACKEND } from './support/installation.js';
import { finishHostScenario, watchSessions, HOST_LEASE_SECONDS, HOST_SCENARIO_TIMEOUT_MS, hostProblems, startHostLoad, startHostScenario, TAKEOVER_MS } from './support/host-scenario.js';
import { HOSTS_UNAVAILABLE, useHostSuite } from './support/host-suite.js';
import { expectClean, runsClaimedBy, until } from './support/scenario.js';
import { sleep } from './support/services.js';

// Across test hosts: a worker host partitioned from the Postgres host during load, for longer
// than its lease, until the other worker has taken at least one of its runs over, then healed.
// The issue's figures are a 90 s partition against the 60 s production lease (a cut-off worker's
// runs are taken over within 90 s: TAKEOVER_MS); here the lease is 6 s, the partition lasts at
// least TAKEOVER_MS (18 s) and ends once a run was taken over, at most after 90 s (the issue's
// partition; before decisions 0092 and 0093 the takeover came after 49-60 s, docs/reliability.md).
// The worker is cut off while it holds runs, if it can one of them inside the non-idempotent
// `charge` step: the other worker takes them over (requeued and run again, or dead-lettered for
// the non-idempotent step), and what the partitioned worker writes when it reaches Postgres again
// must be refused (its lease is gone).
// Every accepted task ends terminal with its result or reason; no run is completed twice, no
// charge made twice, no event pushed under two delivery ids.

const MAX_PARTITION_MS = 90_000;

const suite = useHostSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

const n = z.object({ n: z.number() });
const heldRow = z.object({ id: z.string(), requeue_count: z.number() });
const runNow = z.object({ id: z.string(), requeue_count: z.number(), termination_reason: z.string().nullable(), claimed_by: z.string().nullable() });
const refusalRow = z.object({ run_id: z.string(), worker: z.string(), claim: z.string(), current_claim: z.string().nullable() });

describe.skipIf(HOSTS_UNAVAILABLE !== null)(`a worker host partitioned from Postgres on the ${BACKEND} queue backend`, () => {
  it(
    `worker host cut off from the Postgres host (lease ${HOST_LEASE_SECONDS} s) under load until its runs are taken over, then healed: nothing lost, nothing done twice`,
    async () => {
      const state = await startHostScenario(suite, { chargeMs: 3000 });
      const { pool, cluster } = state;
      const [worker1, worker2] = cluster.workers;
      const faults: Record<string, unknown> = { leaseSeconds: HOST_LEASE_SECONDS };

      const startedAt = Date.now();
      const load = startHostLoad(suite, state);
      const stopWatching = watchSessions(pool, startedAt);
      const holding = async () =>
        (await runsClaimedBy(pool, worker1)) >= 3 &&
        (await pool.oneFirst(sql.type(n)`SELECT count(*)::int AS n FROM runs WHERE status = 'running' AND inside_non_idempotent_call IS NOT NULL AND claimed_by LIKE ${`${worker1.workerPrefix}%`}`)) >= 1;
      faults.heldInsideChargeAtCut = await until(holding, 30_000);
      faults.runsHeldAtCut = await runsClaimedBy(pool, worker1);
      const held = await pool.any(sql.type(heldRow)`SELECT id, requeue_count FROM runs WHERE status = 'running' AND claimed_by LIKE ${`${worker1.workerPrefix}%`}`);
      const heldIds = held.map((run) => run.id);
      const requeuesAtCut = new Map(held.map((run) => [run.id, run.requeue_count]));
      const heal = suite.network.partition(suite.hosts.worker1, suite.hosts.postgres);
      const cutAt = Date.now();
      // Taken over: requeued or dead-lettered by the reaper, or claimed by another worker since (a
      // run the cut-off worker settled just before the cut bit is not: it also has no claim).
      const takenOver = async () =>
        (
          await pool.any(sql.type(runNow)`
            SELECT id, requeue_count, termination_reason, claimed_by FROM runs WHERE id = ANY(${sql.array(heldIds, 'uuid')})`)
        ).filter(
          (run) =>
            run.requeue_count > requeuesAtCut.get(run.id)! ||
            run.termination_reason === 'retries_exhausted' ||
            (run.claimed_by !== null && !run.claimed_by.startsWith(worker1.workerPrefix)),
        ).length;
      const tookOver = await until(async () => (await takenOver()) > 0, MAX_PARTITION_MS, 250);
      faults.firstTakeoverAfterMs = tookOver ? Date.now() - cutAt : null;
      if (Date.now() - cutAt < TAKEOVER_MS) await sleep(TAKEOVER_MS - (Date.now() - cutAt));
      faults.takenOverDuringPartition = await takenOver();
      heal();
      const healedAt = Date.now();
      faults.partitionedForMs = healedAt - cutAt;

      const counts = await finishHostScenario({ scenario: 'hosts-worker-partition', suite, state, load, startedAt, healedAt, faults });
      stopWatching();
      // What became of the runs the partitioned worker held: their timeline, by kind.
      const kinds = await pool.any(sql.type(z.object({ kind: z.string(), n: z.number() }))`
        SELECT kind, count(*)::int AS n FROM run_events WHERE run_id = ANY(${sql.array(heldIds, 'uuid')}) GROUP BY kind ORDER BY kind`);
      console.info(`[faults] hosts-worker-partition (${BACKEND}): timeline of the ${heldIds.length} runs held at the cut: ${kinds.map((row) => `${row.kind} ${row.n}`).join(', ')}`);
      // Fencing (decision 0088): what the cut-off worker wrote late for a run taken over was refused
      // and recorded as `late_write_refused`, naming that worker and its lost claim. Whether there is
      // one depends on what the worker did first after the heal: a write (refused, recorded) or a
      // lease renewal (the loss noticed, the run left without a write). Each refusal it logged is in
      // the timeline; writes that got through would show as runs completed or charged twice (0).
      const refusals = await pool.any(sql.type(refusalRow)`
        SELECT e.run_id, e.payload->>'worker' AS worker, e.payload->>'claim' AS claim, r.claim_token AS current_claim
        FROM run_events e JOIN runs r ON r.id = e.run_id
        WHERE e.run_id = ANY(${sql.array(heldIds, 'uuid')}) AND e.kind = 'late_write_refused'`);
      const loggedRefusals = new Set(
        (worker1.proc?.lines ?? []).flatMap((line) => {
          const match = /"runId":"([0-9a-f-]+)".*"msg":"late writes of a lost claim were refused by its fence/.exec(line);
          return match ? [match[1]!] : [];
        }),
      );
      // (A run taken over can lose its next claim too, on the loaded machine: the other worker's
      // refusals are in the same timeline.)
      const cutOffRefusals = refusals.filter((refusal) => refusal.worker.startsWith(worker1.workerPrefix));
      faults.lateWritesRefused = cutOffRefusals.length;
      console.info(
        `[faults] hosts-worker-partition (${BACKEND}): ${cutOffRefusals.length} late writes of the cut-off worker refused by the fence` +
          (cutOffRefusals.length === 0 ? ' (none this time: the worker noticed each lost lease before it wrote)' : '') +
          `, ${refusals.length - cutOffRefusals.length} of other claims`,
      );
      for (const refusal of refusals) expect(refusal.claim, `the refused claim on ${refusal.run_id} is no longer the run's`).not.toBe(refusal.current_claim);
      // Every refusal the cut-off worker logged (for any run: it may have claimed more after the
      // list of held runs was taken) is in that run's timeline.
      const recorded = await pool.anyFirst(sql.type(z.object({ run_id: z.string() }))`
        SELECT DISTINCT run_id FROM run_events WHERE kind = 'late_write_refused' AND payload->>'worker' LIKE ${`${worker1.workerPrefix}%`}`);
      for (const runId of loggedRefusals) expect(recorded, `the refusal the cut-off worker logged for ${runId} is in its timeline`).toContain(runId);
      expect(faults.runsHeldAtCut, 'the worker held runs when it was cut off').toBeGreaterThan(0);
      expect(faults.takenOverDuringPartition, `runs of the partitioned worker taken over within ${MAX_PARTITION_MS / 1000} s of the cut`).toBeGreaterThan(0);
      // Within the bound (TAKEOVER_MS), not after a minute (decisions 0092, 0093).
      expect(faults.firstTakeoverAfterMs, `the first takeover within ${TAKEOVER_MS / 1000} s of the cut`).toBeLessThanOrEqual(TAKEOVER_MS);
      expectClean(counts, cluster.installation);
      expect(hostProblems(counts)).toEqual([]);
      // Both workers stayed up: the partitioned one serves again after the heal.
      expect(worker1.alive && worker2.alive).toBe(true);
    },
    HOST_SCENARIO_TIMEOUT_MS,
  );
});
