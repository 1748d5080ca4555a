import { sql, type DatabasePool } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { SEQUENCED_EVENTS_URI } from '../../src/a2a/sequenced-events.js';
import { readJournal, type JournalEvent } from '../../src/tasks/journal.js';
import { takeSseEvents } from '../support/sse.js';
import { TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { BACKEND } from './support/installation.js';
import { startLoad, type LoadOptions } from './support/load.js';
import { expectClean, expectedEcho, finishScenario, pendingRuns, runsClaimedBy, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { sleep, type CrashMode } from './support/services.js';
import { useFaultSuite } from './support/suite.js';
import { SUITE_WRITE_PATH_ENV } from '../support/suite-write-path.js';

// Fault scenario: Postgres crashes under load. Unlike a fast shutdown, a crash (`pg_ctl stop -m
// immediate`, or SIGKILL of the postmaster) drops every connection while queries are in flight and
// leaves a server that must replay its WAL when it starts again: for a moment it answers "the
// database system is not yet accepting connections". One API and one worker process serve 240
// nonblocking tasks, each with a push config. Keel must answer again within seconds of the
// server's return, by itself, and lose nothing; while the database is down /readyz answers within
// its own timeout and says why it is not ready. The runs in flight at the crash are the live
// worker's own: it writes again what it lost as soon as the database answers (decision 0054), so
// every run held at the crash completes within 20 s of the return (one still queued within 45 s:
// it waits its turn behind the load that goes on), no run is requeued
// and no task goes back to SUBMITTED (with the production lease: the suite's 2 s one would expire
// during the outage and let the reaper take them first).
//
// The same crash (immediate) with one process of role `all` instead: new tasks take the fast path
// (their runs inserted claimed by the process that received them, their WORKING event journaled and
// pushed with the task), blocking and nonblocking, each with a push config, while a few streams that
// created their task stay open across the crash. Every task completes with its result and its
// COMPLETED pushed, no event reaches the receiver under two delivery ids, and every event a stream
// or the receiver was shown is still in the journal, unchanged, after crash recovery; a stream
// resumed with Last-Event-ID continues at the next sequence to COMPLETED, and one resumed with the
// sequenced-events extension from a random point gets the stamped Task, then every event after it.

/** How long Keel may take to answer again once Postgres accepts connections: seconds, not minutes. */
const ANSWER_AGAIN_BOUND_MS = 15_000;
/**
 * How long after Postgres accepts connections again a task accepted before the crash may take to
 * complete: a live process writes again what it lost itself (docs/reliability.md), it does not
 * wait out the run's lease (60 s) and a requeue.
 */
const RECOVERED_BOUND_MS = 20_000;
/**
 * How long after Postgres's return a run still queued at the crash may take to complete: it waits
 * its turn behind the held ones and the load that goes on, which on a loaded two-core CI machine
 * took up to 24 s (2026-12-05); what matters for it is that it completes and is never requeued.
 */
const QUEUED_BOUND_MS = 45_000;
/**
 * How long after Postgres's return a push delivery of an event journaled before the crash may take
 * to end: the job that lost its connection processes it again once the database answers
 * (src/queue/once-database-answers.ts), and the delivery waits only its turn in the outbox's
 * backlog (the load goes on after the return: up to 12.5 s on the loaded CI machine). Before that,
 * on the Postgres queue backend, a job that failed while Postgres was away stayed 'active' until
 * BullMQ found it stalled, and its delivery ended about 54 s after the return.
 */
const DELIVERED_BOUND_MS = 30_000;
/**
 * The lease of a production start (runs.leaseSeconds' default), not the suite's 2 s: these
 * scenarios are about live processes recovering their own runs, and a lease that ran out while
 * Postgres was down would let the reaper requeue them first (the way for a process that died).
 */
const PRODUCTION_LEASE = { KEEL_RUNS_LEASE_SECONDS: '60' };
/** /readyz probes with a 2 s deadline; the margin is for a loaded two-core machine. */
const READYZ_ANSWER_BOUND_MS = 4_000;

const suite = useFaultSuite({ receiver: () => ({ kind: 'ok', delayMs: 10 + Math.random() * 40 }) });

type Readyz = { status: number; elapsedMs: number; body: { status?: string; reasons?: { database?: string } } | null };

async function readyz(baseUrl: string): Promise<Readyz> {
  const started = Date.now();
  try {
    const response = await fetch(`${baseUrl}/readyz`, { signal: AbortSignal.timeout(30_000) });
    return { status: response.status, elapsedMs: Date.now() - started, body: (await response.json()) as Readyz['body'] };
  } catch {
    return { status: 0, elapsedMs: Date.now() - started, body: null };
  }
}

/** One A2A call that needs the database: GetTask of a task that does not exist (TaskNotFound, -32001). */
async function answersA2A(baseUrl: string, token: string): Promise<boolean> {
  const response = await fetch(`${baseUrl}/a2a/model`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'GetTask', params: { id: '00000000-0000-4000-8000-000000000000' } }),
    signal: AbortSignal.timeout(3000),
  });
  const body = (await response.json()) as { error?: { code?: number } };
  return body.error?.code === -32001;
}

// ---------------------------------------------------------------------------------------------
// The fast path under a crash: one process of role `all` runs the new tasks it receives itself
// (the run inserted claimed, `started_at = created_at`), and a few clients hold streams across the
// crash, opened just before the load (run slots free: their tasks take the fast path too). Their tasks
// are a scripted agent's: a first step of 20 s (longer than the load takes to reach the crash on a
// loaded machine), so a stream has shown the task's WORKING event (the fast path's own, journaled
// with the task) before the crash and is still running when Keel answers again; then three chunks
// of an artifact and the answer, which the resumed stream shows. No artifact before the crash on purpose: a run requeued after the crash
// starts its loop again from the request and journals every artifact it had emitted a second time
// (a non-append event for an announced artifact id), which the suite counts as a duplicate event
// of its own (see the report of this scenario).

const STREAMS = 4;
const FIRST_STEP_MS = 20_000;
const lookup = (key: string) => [{ name: 'lookup', arguments: { key } }];
const CHUNKS = {
  type: 'scripted',
  steps: [
    { delayMs: FIRST_STEP_MS, toolCalls: lookup('first') },
    { delayMs: 800, artifact: { artifactId: 'report', name: 'report', text: 'chunk 1; ' }, toolCalls: lookup('1') },
    { delayMs: 800, artifact: { artifactId: 'report', text: 'chunk 2; ', append: true }, toolCalls: lookup('2') },
    { delayMs: 800, artifact: { artifactId: 'report', text: 'chunk 3', append: true, lastChunk: true }, toolCalls: lookup('3') },
    { delayMs: 300, reply: 'report done' },
  ],
};
/** The result a completed task carries: the fake model's echo, or the scripted agent's reply. */
const expectedOfAgent: LoadOptions['expected'] = (agent, text) => (agent === 'chunks' ? 'report done' : `echo: ${text}`);

const countRow = z.object({ n: z.number() });
const lateRow = z.object({ id: z.string(), agent: z.string(), status: z.string(), settled_after_ms: z.number().nullable(), requeue_count: z.number() });
const deliveryEndRow = z.object({ id: z.string(), state: z.string(), attempts: z.number(), ended_after_ms: z.number().nullable() });

/** The runs a process holds (claimed, running) right now: at the crash, those it must write again itself. */
async function heldRuns(pool: DatabasePool): Promise<ReadonlySet<string>> {
  return new Set(await pool.anyFirst(sql.type(z.object({ id: z.string() }))`SELECT id FROM runs WHERE status = 'running'`));
}

/**
 * How the tasks accepted before the crash recovered: those not completed within their bound after
 * Postgres's return (`backAt`), besides a scripted agent's own steps (its `ownMs` from the run's
 * creation): RECOVERED_BOUND_MS for a run held at the crash (`held`), QUEUED_BOUND_MS for one still
 * queued; the runs requeued, and the tasks whose journal went back to SUBMITTED after WORKING (a
 * requeue's way, which a live process must not take for its own runs).
 */
async function recoveryOf(pool: DatabasePool, crashedAt: number, backAt: number, held: ReadonlySet<string>, ownMs: (agent: string) => number = () => 0) {
  const runs = await pool.any(sql.type(lateRow)`
    SELECT id, agent, status, requeue_count,
      extract(epoch FROM settled_at - to_timestamp(${backAt} / 1000.0)) * 1000 AS settled_after_ms
    FROM runs WHERE created_at < to_timestamp(${crashedAt} / 1000.0)`);
  const boundOf = (run: z.infer<typeof lateRow>) => (held.has(run.id) ? RECOVERED_BOUND_MS : QUEUED_BOUND_MS) + ownMs(run.agent);
  const late = runs
    .filter((run) => run.status !== 'completed' || run.settled_after_ms === null || run.settled_after_ms > boundOf(run))
    .map((run) => ({ ...run, heldAtCrash: held.has(run.id) }));
  const requeued = runs.filter((run) => run.requeue_count > 0);
  const backToSubmitted = await pool.anyFirst(sql.type(z.object({ task_id: z.string() }))`
    SELECT DISTINCT s.task_id FROM a2a_events s JOIN a2a_events w ON w.task_id = s.task_id
    WHERE s.state = 'TASK_STATE_SUBMITTED' AND w.state = 'TASK_STATE_WORKING' AND s.sequence > w.sequence`);
  const slowestOf = (subset: readonly z.infer<typeof lateRow>[]) => Math.round(Math.max(0, ...subset.map((run) => run.settled_after_ms ?? 0)));
  // The run that came closest to its bound, with how much of it was left: the margin a slower
  // machine eats into first.
  const margins = runs.map((run) => ({ id: run.id, agent: run.agent, held: held.has(run.id), marginMs: Math.round(boundOf(run) - (run.settled_after_ms ?? Infinity)) }));
  const closestToBound = margins.reduce<(typeof margins)[number] | null>((closest, run) => (closest === null || run.marginMs < closest.marginMs ? run : closest), null);
  // The deliveries of events journaled before the crash, pending or not at the crash.
  const deliveries = await pool.any(sql.type(deliveryEndRow)`
    SELECT id, state, attempts, extract(epoch FROM ended_at - to_timestamp(${backAt} / 1000.0)) * 1000 AS ended_after_ms
    FROM push_deliveries WHERE created_at < to_timestamp(${crashedAt} / 1000.0)`);
  const lateDeliveries = deliveries.filter((delivery) => delivery.state !== 'delivered' || (delivery.ended_after_ms ?? Infinity) > DELIVERED_BOUND_MS);
  return {
    acceptedBeforeCrash: runs.length,
    heldAtCrash: runs.filter((run) => held.has(run.id)).length,
    slowestHeldAfterReturnMs: slowestOf(runs.filter((run) => held.has(run.id))),
    slowestAfterReturnMs: slowestOf(runs),
    late,
    closestToBound,
    requeued: requeued.map((run) => run.id),
    backToSubmitted,
    deliveriesBeforeCrash: deliveries.length,
    slowestDeliveryAfterReturnMs: Math.round(Math.max(0, ...deliveries.map((delivery) => delivery.ended_after_ms ?? Infinity))),
    lateDeliveries,
  };
}

function expectRecovered(recovery: Awaited<ReturnType<typeof recoveryOf>>) {
  // The late runs in the message's first line, which is what a CI log's summary keeps.
  const late = recovery.late.map((run) => `${run.agent} ${run.heldAtCrash ? 'held' : 'queued'} ${run.status} ${run.settled_after_ms === null ? 'unsettled' : `${Math.round(run.settled_after_ms)} ms`} requeues ${run.requeue_count}`);
  expect.soft(recovery.late, `tasks accepted before the crash and late after Postgres's return: ${late.join('; ')} (bounds: ${RECOVERED_BOUND_MS} ms held at the crash, ${QUEUED_BOUND_MS} ms queued, besides a scripted agent's own steps)`).toEqual([]);
  expect.soft(recovery.requeued, 'runs requeued (left to their lease instead of written again by their live process)').toEqual([]);
  expect.soft(recovery.backToSubmitted, 'tasks whose journal went back to SUBMITTED after WORKING').toEqual([]);
  const lateDeliveries = recovery.lateDeliveries.map((delivery) => `${delivery.state} after ${delivery.attempts} attempts ${delivery.ended_after_ms === null ? 'not ended' : `${Math.round(delivery.ended_after_ms)} ms`}`);
  expect.soft(recovery.lateDeliveries, `deliveries of events journaled before the crash, not delivered within ${DELIVERED_BOUND_MS} ms of Postgres's return: ${lateDeliveries.join('; ')}`).toEqual([]);
}
const deliveryRow = z.object({ id: z.string(), task_id: z.string(), event_sequence: z.number() });
const runPath = z.object({ id: z.string(), fast: z.boolean().nullable(), requeue_count: z.number() });

type Binding = 'jsonrpc' | 'rest';
/** One SSE frame: its `id:` line, its data, and when it arrived. */
type Frame = { id: number | null; at: number; data: Record<string, unknown> };
type SseStream = {
  status: number;
  contentType: string;
  /** The body when the answer is not a stream (an error). */
  body: string;
  frames: Frame[];
  /** How the stream ended: the server ended it, we aborted it, or the connection failed. */
  ended: Promise<'end' | 'aborted' | 'error'>;
  done: () => boolean;
  abort: () => void;
};

/** A raw SSE client over fetch, so the `id:` lines are visible. */
async function openStream(url: string, headers: Record<string, string>, body: string | null): Promise<SseStream> {
  const controller = new AbortController();
  const response = await fetch(url, { method: 'POST', headers, ...(body !== null ? { body } : {}), signal: controller.signal });
  const contentType = response.headers.get('content-type') ?? '';
  const frames: Frame[] = [];
  if (!contentType.includes('text/event-stream')) {
    return { status: response.status, contentType, body: await response.text(), frames, ended: Promise.resolve('end'), done: () => true, abort: () => undefined };
  }
  let aborted = false;
  let finished = false;
  const reader = response.body!.getReader();
  const ended = (async (): Promise<'end' | 'aborted' | 'error'> => {
    const decoder = new TextDecoder();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return 'end';
        buffer += decoder.decode(value, { stream: true });
        const parsed = takeSseEvents(buffer);
        buffer = parsed.rest;
        for (const event of parsed.events) frames.push({ id: event.id, at: Date.now(), data: event.data as Record<string, unknown> });
      }
    } catch {
      return aborted ? 'aborted' : 'error';
    } finally {
      finished = true;
    }
  })();
  return {
    status: response.status,
    contentType,
    body: '',
    frames,
    ended,
    done: () => finished,
    abort: () => {
      aborted = true;
      controller.abort();
    },
  };
}

const sseHeaders = (token: string, extra: Record<string, string> = {}) => ({ authorization: `Bearer ${token}`, 'a2a-version': '1.0', accept: 'text/event-stream', ...extra });

/** SendStreamingMessage (JSON-RPC) or `message:stream` (HTTP+JSON) to the scripted agent, with a push config. */
function sendStreaming(api: string, token: string, binding: Binding, text: string, pushUrl: string): Promise<SseStream> {
  const params = {
    message: { messageId: crypto.randomUUID(), role: 'ROLE_USER', parts: [{ text }] },
    configuration: { taskPushNotificationConfig: { id: 'hook', url: pushUrl } },
  };
  const headers = sseHeaders(token, { 'content-type': 'application/json' });
  if (binding === 'rest') return openStream(`${api}/a2a/chunks/message:stream`, headers, JSON.stringify(params));
  return openStream(`${api}/a2a/chunks`, headers, JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendStreamingMessage', params }));
}

/** SubscribeToTask with `Last-Event-ID`, on either binding. */
function resubscribe(api: string, token: string, binding: Binding, taskId: string, lastEventId: number): Promise<SseStream> {
  const headers = sseHeaders(token, { 'last-event-id': String(lastEventId) });
  if (binding === 'rest') return openStream(`${api}/a2a/chunks/tasks/${taskId}:subscribe`, headers, null);
  return openStream(`${api}/a2a/chunks`, { ...headers, 'content-type': 'application/json' }, JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'SubscribeToTask', params: { id: taskId } }));
}

/**
 * SubscribeToTask with the sequenced-events extension activated (docs/extensions/sequenced-events.md),
 * resuming after `afterSequence`: `Last-Event-ID` on HTTP+JSON, `params.metadata` on JSON-RPC.
 */
function resubscribeSequenced(api: string, token: string, binding: Binding, taskId: string, afterSequence: number): Promise<SseStream> {
  const activated = { 'a2a-extensions': SEQUENCED_EVENTS_URI };
  if (binding === 'rest') return openStream(`${api}/a2a/chunks/tasks/${taskId}:subscribe`, sseHeaders(token, { ...activated, 'last-event-id': String(afterSequence) }), null);
  const params = { id: taskId, metadata: { [SEQUENCED_EVENTS_URI]: { afterSequence } } };
  return openStream(`${api}/a2a/chunks`, sseHeaders(token, { ...activated, 'content-type': 'application/json' }), JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'SubscribeToTask', params }));
}

/** The extension's entry in a StreamResponse's own metadata (a Task's `lastSequence`, an event's `sequence`). */
function sequenceEntryOf(response: Record<string, unknown>): { sequence?: number; lastSequence?: number } | undefined {
  const inner = Object.values(response)[0] as { metadata?: Record<string, unknown> } | undefined;
  return inner?.metadata?.[SEQUENCED_EVENTS_URI] as { sequence?: number; lastSequence?: number } | undefined;
}

/** A stamped StreamResponse as the journal holds it: without the extension's entry (and without metadata it alone filled). */
function unstamped(response: Record<string, unknown>): Record<string, unknown> {
  const [key, inner] = Object.entries(response)[0] ?? [];
  if (key === undefined || typeof inner !== 'object' || inner === null) return response;
  const { metadata, ...rest } = inner as { metadata?: Record<string, unknown> };
  const { [SEQUENCED_EVENTS_URI]: _entry, ...others } = metadata ?? {};
  return { [key]: Object.keys(others).length > 0 ? { ...rest, metadata: others } : rest };
}

/** The StreamResponse a frame carries (JSON-RPC wraps it in `result`). */
const responseOf = (frame: Frame, binding: Binding) => ((binding === 'jsonrpc' ? frame.data.result : frame.data) as Record<string, unknown> | undefined) ?? {};

function stateOf(response: Record<string, unknown>): string | null {
  const status = (response.statusUpdate as { status?: { state?: string } } | undefined)?.status ?? (response.task as { status?: { state?: string } } | undefined)?.status;
  return status?.state ?? null;
}

/** An event in brief, for the report: its state, or its artifact's text. */
function brief(response: Record<string, unknown>): string {
  const artifact = (response.artifactUpdate as { artifact?: { artifactId?: string; parts?: Array<{ text?: string }> } } | undefined)?.artifact;
  if (artifact) return `artifact ${artifact.artifactId}: ${(artifact.parts ?? []).map((part) => part.text ?? '').join('')}`.slice(0, 80);
  return stateOf(response) ?? JSON.stringify(response).slice(0, 80);
}

/** JSON as it travels: what a client can compare with what it read. */
const wire = (value: unknown) => JSON.stringify(value);

type StreamTrace = { index: number; binding: Binding; taskId: string; creating: SseStream; beforeCrash: Frame[]; lastBeforeCrash: number; resumed: SseStream | null; replay: SseStream | null; sequenced: SseStream | null; sequencedAfter: number };

/**
 * What a client shown `frames` must still find in the journal: each event (id ≥ 1; id 0 is the
 * creating stream's SUBMITTED Task, not a journal event) at its sequence, with the same content.
 */
function shownProblems(label: string, frames: readonly Frame[], binding: Binding, journal: ReadonlyMap<number, JournalEvent>, stamped = false): string[] {
  const problems: string[] = [];
  for (const frame of frames) {
    if (frame.id === null) {
      problems.push(`${label}: a frame without an id: ${JSON.stringify(frame.data).slice(0, 200)}`);
      continue;
    }
    if (frame.id === 0) continue;
    const shown = stamped ? unstamped(responseOf(frame, binding)) : responseOf(frame, binding);
    if (stamped && sequenceEntryOf(responseOf(frame, binding))?.sequence !== frame.id) problems.push(`${label}: event ${frame.id} carries sequence ${JSON.stringify(sequenceEntryOf(responseOf(frame, binding)))}`);
    const event = journal.get(frame.id);
    if (!event) problems.push(`${label}: event ${frame.id} (${brief(shown)}) is no longer in the journal`);
    else if (wire(shown) !== wire(event.response)) problems.push(`${label}: event ${frame.id} changed: shown ${wire(shown).slice(0, 300)}, journal now ${wire(event.response).slice(0, 300)}`);
  }
  return problems;
}

/** Whether frame ids run n, n+1, n+2, … */
const consecutive = (frames: readonly Frame[]) => frames.every((frame, index) => index === 0 || frame.id === frames[index - 1]!.id! + 1);

describe(`Postgres crashed under load on the ${BACKEND} queue backend`, () => {
  // One crash mode per topology, both on each queue backend: the split roles take the SIGKILL of
  // the postmaster, the one `all` process below the immediate stop (the pool's own file, pool-crash,
  // takes both). The split roles under an immediate stop as well added 80 s to each CI pass and
  // crossed no code path the other two do not (docs/reliability.md, "Postgres crash").
  it.each<[CrashMode, string]>([['kill', 'SIGKILL of the postmaster']])(
    '%s: after %s and crash recovery Keel answers again within seconds, nothing lost',
    async (mode) => {
      const { postgres, receiver } = suite;
      const installation = await suite.install({ env: PRODUCTION_LEASE });
      const api = await installation.addNode('api');
      const worker = await installation.addNode('worker');
      const pool = await installation.pool();
      const faults: Record<string, unknown> = { mode };
      let recovery: Awaited<ReturnType<typeof recoveryOf>> | null = null;
      const startedAt = Date.now();
      const load = startLoad({
        apis: () => installation.apiUrls(),
        token: installation.token,
        count: 240,
        ratePerSecond: 20,
        maxInFlight: 16,
        blocking: () => false,
        pushUrl: receiver.url,
        pushFor: () => true,
        expected: expectedEcho,
      });
      expect(await until(async () => load.accepted() >= 100 && (await runsClaimedBy(pool, worker)) >= 3, 60_000), 'runs in flight').toBe(true);
      faults.runsHeldAtCrash = await runsClaimedBy(pool, worker);
      faults.openRunsAtCrash = await pendingRuns(pool);
      const held = await heldRuns(pool);

      const crashedAt = Date.now();
      const crash = postgres.crash(mode, 3000);
      // While the server is down, /readyz answers within its own timeout and names the database.
      await sleep(1000);
      const whileDown = await Promise.all([readyz(api.url), readyz(worker.url)]);
      const report = await crash;
      const backAt = Date.now();
      faults.downMs = backAt - crashedAt;
      faults.crashRecovery = report.recovered;
      faults.readyzWhileDown = whileDown.map((probe) => ({ status: probe.status, elapsedMs: probe.elapsedMs, reason: probe.body?.reasons?.database }));
      for (const probe of whileDown) {
        expect(probe.elapsedMs, 'readyz answered within its timeout').toBeLessThan(READYZ_ANSWER_BOUND_MS);
        expect(probe.status).toBe(503);
        expect(probe.body?.status).toBe('not_ready');
        expect(probe.body?.reasons?.database, 'readyz says why').toMatch(/\S/);
      }
      // The server went through crash recovery, not a clean start.
      expect(report.recovered, 'Postgres replayed its WAL').toBe(true);

      // Keel answers again: both processes ready, and an A2A call that reads the database.
      let lastSeen: unknown = null;
      const answering = await until(
        async () => {
          const probes = await Promise.all([readyz(api.url), readyz(worker.url)]);
          const a2a = await answersA2A(api.url, installation.token).catch((error: Error) => error.message);
          lastSeen = { readyz: probes.map((probe) => [probe.status, probe.elapsedMs, probe.body]), a2a };
          return probes.every((probe) => probe.status === 200) && a2a === true;
        },
        ANSWER_AGAIN_BOUND_MS,
        100,
      );
      faults.answeringAgainMs = Date.now() - backAt;
      expect(answering, `Keel answers again within ${ANSWER_AGAIN_BOUND_MS} ms of Postgres's return; last seen ${JSON.stringify(lastSeen)}`).toBe(true);

      const counts = await finishScenario({
        scenario: `postgres-crash-${mode}`,
        installation,
        load,
        startedAt,
        receiver,
        faults: async () => ({ ...faults, recovery: (recovery = await recoveryOf(pool, crashedAt, backAt, held)) }),
      });
      // Both processes lived through it: nobody restarted them.
      expect(api.generations).toHaveLength(1);
      expect(worker.generations).toHaveLength(1);
      expect(api.alive && worker.alive).toBe(true);
      expectClean(counts, installation);
      // The runs in flight at the crash were written again by the worker that held them, within seconds.
      expectRecovered(recovery ?? (await recoveryOf(pool, crashedAt, backAt, held)));
    },
    SCENARIO_TIMEOUT_MS,
  );

  // The fast path's own scenario: with runs.directWrites (the suite's second write path, .ci/run)
  // there is no fast path to crash, and the default pass runs it.
  it.skipIf(SUITE_WRITE_PATH_ENV.KEEL_RUNS_DIRECT_WRITES === 'true')(
    'immediate, one all process on the fast path, a push receiver per task: every task COMPLETED with its result and its COMPLETED pushed, no event under two delivery ids, streams resumed across the crash see no event change or vanish',
    async () => {
      const { postgres, receiver, model } = suite;
      const installation = await suite.install({
        env: {
          ...PRODUCTION_LEASE,
          KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
          KEEL_PROVIDERS: JSON.stringify({ fake: { type: 'openai', baseUrl: model.baseUrl, model: 'fake', timeoutSeconds: 10 }, chunks: CHUNKS }),
          KEEL_AGENTS: JSON.stringify([
            { id: 'model', name: 'Model', provider: 'fake', privacy: { answerLevel: 'full' } },
            { id: 'chunks', name: 'Chunks', provider: 'chunks', tools: ['lookup'], privacy: { answerLevel: 'full' } },
          ]),
        },
      });
      // API and workers in one process: a new task with a free run slot takes the fast path.
      const node = await installation.addNode('all');
      const pool = await installation.pool();
      const { token } = installation;
      const faults: Record<string, unknown> = { mode: 'immediate', role: 'all' };
      const startedAt = Date.now();
      // A few streams that create their task, half on each HTTP binding, opened before the load
      // starts: the process's run slots are free, so their tasks take the fast path too (opened
      // under load they may not, and a queued one waits for a slot the fast path leaves).
      const creating = await Promise.all(
        Array.from({ length: STREAMS }, (_, index) => sendStreaming(node.url, token, index % 2 === 0 ? 'jsonrpc' : 'rest', `stream ${index}`, receiver.url)),
      );
      const load = startLoad({
        apis: () => installation.apiUrls(),
        token,
        count: 240,
        ratePerSecond: 20,
        maxInFlight: 16,
        blocking: (index) => index % 2 === 0,
        pushUrl: receiver.url,
        pushFor: () => true,
        expected: expectedEcho,
      });
      for (const stream of creating) expect(stream.contentType, `${stream.status} ${stream.body}`).toContain('text/event-stream');

      // The crash, once runs are in flight, some of them fast (inserted claimed: started_at = created_at)
      // and every stream has shown its task's WORKING event (id 1), and nothing after it yet.
      const fastRunning = () => pool.oneFirst(sql.type(countRow)`SELECT count(*)::int AS n FROM runs WHERE status = 'running' AND started_at = created_at`);
      let seen: unknown = null;
      const inFlight = await until(async () => {
        const held = await runsClaimedBy(pool, node);
        const fast = await fastRunning();
        const shown = creating.map((stream) => Math.max(-1, ...stream.frames.map((frame) => frame.id ?? -1)));
        seen = { accepted: load.accepted(), held, fast, streamIds: shown };
        // Besides the streams' runs (fast), load runs in flight; how many of those took the fast
        // path depends on the moment (the fast path holds at most half the slots while runs wait in
        // the queue), so the figures are recorded, not required. 40 of the 240 accepted, not 100 as
        // in the other scenarios: on a loaded machine the load took longer than the streams' 20 s
        // first step to reach 100, and the streams had moved past WORKING.
        return load.accepted() >= 40 && held >= STREAMS + 3 && fast >= STREAMS && shown.every((id) => id === 1) && creating.every((stream) => !stream.done());
      }, 60_000);
      expect(inFlight, `runs in flight, some fast, every stream showing WORKING; last seen ${JSON.stringify(seen)}`).toBe(true);
      faults.runsHeldAtCrash = await runsClaimedBy(pool, node);
      faults.fastRunningAtCrash = await fastRunning();
      faults.fastRunsAtCrash = await pool.oneFirst(sql.type(countRow)`SELECT count(*)::int AS n FROM runs WHERE started_at = created_at`);
      faults.queuedPathRunsAtCrash = await pool.oneFirst(sql.type(countRow)`SELECT count(*)::int AS n FROM runs WHERE started_at IS DISTINCT FROM created_at`);
      faults.openRunsAtCrash = await pendingRuns(pool);
      const streamRunsFast = await pool.oneFirst(sql.type(countRow)`SELECT count(*)::int AS n FROM runs WHERE agent = 'chunks' AND status = 'running' AND started_at = created_at`);
      expect(streamRunsFast, "the streams' tasks took the fast path").toBe(STREAMS);
      expect(faults.fastRunsAtCrash, 'runs took the fast path before the crash').toBeGreaterThan(0);
      const held = await heldRuns(pool);

      const crashedAt = Date.now();
      const report = await postgres.crash('immediate', 3000);
      const backAt = Date.now();
      faults.downMs = backAt - crashedAt;
      faults.crashRecovery = report.recovered;
      expect(report.recovered, 'Postgres replayed its WAL').toBe(true);

      let lastSeen: unknown = null;
      const answering = await until(
        async () => {
          const probe = await readyz(node.url);
          const a2a = await answersA2A(node.url, token).catch((error: Error) => error.message);
          lastSeen = { readyz: [probe.status, probe.elapsedMs, probe.body], a2a };
          return probe.status === 200 && a2a === true;
        },
        ANSWER_AGAIN_BOUND_MS,
        100,
      );
      faults.answeringAgainMs = Date.now() - backAt;
      expect(answering, `Keel answers again within ${ANSWER_AGAIN_BOUND_MS} ms of Postgres's return; last seen ${JSON.stringify(lastSeen)}`).toBe(true);

      // Each stream resumed after the last event it showed before the crash, on its own binding, and
      // replayed from the start (Last-Event-ID 0) on the other: both while its task still runs.
      const traces: StreamTrace[] = await Promise.all(
        creating.map(async (stream, index) => {
          const binding: Binding = index % 2 === 0 ? 'jsonrpc' : 'rest';
          const beforeCrash = stream.frames.filter((frame) => frame.at < crashedAt);
          const taskId = (responseOf(stream.frames[0]!, binding).task as { id: string }).id;
          const lastBeforeCrash = beforeCrash[beforeCrash.length - 1]!.id!;
          // And with the sequenced-events extension, from a random point the stream had shown.
          const sequencedAfter = Math.floor(Math.random() * (lastBeforeCrash + 1));
          const [resumed, replay, sequenced] = await Promise.all([
            resubscribe(node.url, token, binding, taskId, lastBeforeCrash),
            resubscribe(node.url, token, binding === 'jsonrpc' ? 'rest' : 'jsonrpc', taskId, 0),
            resubscribeSequenced(node.url, token, binding, taskId, sequencedAfter),
          ]);
          return { index, binding, taskId, creating: stream, beforeCrash, lastBeforeCrash, resumed, replay, sequenced, sequencedAfter };
        }),
      );

      // The scripted agent's own steps (from the run's creation) are not recovery time.
      const scriptMs = (agent: string) => (agent === 'chunks' ? FIRST_STEP_MS + 3 * 800 + 300 : 0);
      let recovery: Awaited<ReturnType<typeof recoveryOf>> | null = null;
      const counts = await finishScenario({
        scenario: 'postgres-crash-immediate-all-fast-path',
        installation,
        load,
        startedAt,
        receiver,
        faults: async () => ({ ...faults, recovery: (recovery = await recoveryOf(pool, crashedAt, backAt, held, scriptMs)) }),
        expected: expectedOfAgent,
      });
      // Every task has ended: its streams have ended too (a creating stream the crash left open is cut).
      const open = traces.flatMap((trace) => [trace.creating, trace.resumed, trace.replay, trace.sequenced]).filter((stream): stream is SseStream => stream !== null);
      await until(() => open.every((stream) => stream.done()), 30_000, 100);
      const endings = await Promise.all(
        traces.map(async (trace) => {
          const creatingEnd = trace.creating.done() ? await trace.creating.ended : (trace.creating.abort(), 'open');
          const resumedEnd = trace.resumed!.done() ? await trace.resumed!.ended : (trace.resumed!.abort(), 'open');
          const replayEnd = trace.replay!.done() ? await trace.replay!.ended : (trace.replay!.abort(), 'open');
          const sequencedEnd = trace.sequenced!.done() ? await trace.sequenced!.ended : (trace.sequenced!.abort(), 'open');
          return { creatingEnd, resumedEnd, replayEnd, sequencedEnd };
        }),
      );

      const runOf = new Map((await pool.any(sql.type(runPath)`SELECT id, started_at = created_at AS fast, requeue_count FROM runs`)).map((row) => [row.id, row]));

      // ---- the streams: nothing shown before the crash changed or vanished; the resume continues it ----
      const problems: string[] = [];
      const streamFacts: unknown[] = [];
      for (const trace of traces) {
        const { taskId, binding, resumed, replay } = trace;
        const other: Binding = binding === 'jsonrpc' ? 'rest' : 'jsonrpc';
        const say = (text: string) => problems.push(`stream ${trace.index} (${binding}, task ${taskId}): ${text}`);
        const journal = await readJournal(pool, installation.sealer, taskId, 0);
        const bySequence = new Map(journal.map((event) => [event.sequence, event]));
        const ending = endings[trace.index]!;
        streamFacts.push({
          taskId,
          binding,
          run: runOf.get(taskId),
          beforeCrash: trace.beforeCrash.map((frame) => frame.id),
          afterCrashOnCreating: trace.creating.frames.filter((frame) => frame.at >= crashedAt).map((frame) => frame.id),
          resumedIds: resumed!.frames.map((frame) => frame.id),
          journal: journal.map((event) => `${event.sequence}:${brief(event.response as Record<string, unknown>)}`),
          ...ending,
        });

        // Before the crash: the SUBMITTED Task (id 0), then journal events 1, 2, … as they were committed.
        const [first, ...events] = trace.beforeCrash;
        if (first?.id !== 0 || stateOf(responseOf(first, binding)) !== 'TASK_STATE_SUBMITTED') say(`the stream did not start with the SUBMITTED task (id ${first?.id})`);
        if (events[0]?.id !== 1 || !consecutive(events)) say(`ids before the crash ${trace.beforeCrash.map((frame) => frame.id).join(',')}`);
        // Everything the creating stream showed, before the crash and after it, is in the journal unchanged.
        for (const problem of shownProblems('before the crash', trace.beforeCrash, binding, bySequence)) say(problem);
        for (const problem of shownProblems('after the crash, same stream', trace.creating.frames.filter((frame) => frame.at >= crashedAt), binding, bySequence)) say(problem);

        // The resume: the next sequence on, consecutive, unchanged, to COMPLETED, and then the stream ends.
        if (resumed!.contentType.includes('text/event-stream')) {
          const frames = resumed!.frames;
          if (frames[0]?.id !== trace.lastBeforeCrash + 1) say(`resumed after ${trace.lastBeforeCrash} at ${frames[0]?.id ?? 'nothing'}`);
          if (!consecutive(frames)) say(`resumed ids ${frames.map((frame) => frame.id).join(',')}`);
          const last = frames[frames.length - 1];
          if (!last || stateOf(responseOf(last, binding)) !== 'TASK_STATE_COMPLETED') say(`the resumed stream ended with ${last ? brief(responseOf(last, binding)) : 'nothing'}, not COMPLETED`);
          if (ending.resumedEnd !== 'end') say(`the resumed stream ended by ${ending.resumedEnd}`);
          for (const problem of shownProblems('resumed', frames, binding, bySequence)) say(problem);
        } else {
          say(`resume after ${trace.lastBeforeCrash} refused: ${resumed!.status} ${resumed!.body.slice(0, 300)}`);
        }
        // The replay from Last-Event-ID 0: the whole journal, as it is in the database.
        if (replay!.contentType.includes('text/event-stream')) {
          const ids = replay!.frames.map((frame) => frame.id);
          if (wire(ids) !== wire(journal.map((event) => event.sequence))) say(`replay ids ${ids.join(',')} ≠ journal ${journal.map((event) => event.sequence).join(',')}`);
          for (const problem of shownProblems('replayed', replay!.frames, other, bySequence)) say(problem);
        } else {
          say(`replay from 0 refused: ${replay!.status} ${replay!.body.slice(0, 300)}`);
        }
        // The extension's resume from a random point: the Task first (stamped with the last
        // sequence it reflects), then every event after the point, each carrying its own number,
        // none missing, none twice, none changed, to COMPLETED.
        const sequenced = trace.sequenced!;
        if (sequenced.contentType.includes('text/event-stream')) {
          const [snapshot, ...events] = sequenced.frames;
          const stamp = snapshot ? sequenceEntryOf(responseOf(snapshot, binding)) : undefined;
          if (!snapshot || !('task' in responseOf(snapshot, binding)) || typeof stamp?.lastSequence !== 'number' || stamp.lastSequence < trace.sequencedAfter) {
            say(`the sequenced resume after ${trace.sequencedAfter} did not start with a stamped Task: ${snapshot ? JSON.stringify(responseOf(snapshot, binding)).slice(0, 200) : 'nothing'}`);
          }
          const expectedIds = journal.filter((event) => event.sequence > trace.sequencedAfter).map((event) => event.sequence);
          if (wire(events.map((frame) => frame.id)) !== wire(expectedIds)) say(`sequenced resume after ${trace.sequencedAfter}: ids ${events.map((frame) => frame.id).join(',')} ≠ journal ${expectedIds.join(',')}`);
          for (const problem of shownProblems('sequenced resume', events, binding, bySequence, true)) say(problem);
          if (ending.sequencedEnd !== 'end') say(`the sequenced resume ended by ${ending.sequencedEnd}`);
        } else {
          say(`sequenced resume after ${trace.sequencedAfter} refused: ${sequenced.status} ${sequenced.body.slice(0, 300)}`);
        }
        if (journal[journal.length - 1]?.state !== 'TASK_STATE_COMPLETED') say(`the journal ends ${journal[journal.length - 1]?.state ?? 'empty'}`);
      }

      // ---- pushes: every accepted task's COMPLETED reached the receiver, acknowledged ----
      const acceptedIds = [...load.records.flatMap((record) => (record.taskId ? [record.taskId] : [])), ...traces.map((trace) => trace.taskId)];
      const completedPushed = new Set(
        receiver.receipts
          .filter((receipt) => receipt.ackedAt !== null)
          .map((receipt) => receipt.body as { statusUpdate?: { taskId?: string; status?: { state?: string } } } | undefined)
          .filter((body) => body?.statusUpdate?.status?.state === 'TASK_STATE_COMPLETED')
          .map((body) => body!.statusUpdate!.taskId!),
      );
      const notPushed = acceptedIds.filter((id) => !completedPushed.has(id));
      // For the report: each event the receiver got under more than one delivery id, with the journal sequences those ids name.
      const deliveries = await pool.any(sql.type(deliveryRow)`SELECT id, task_id, event_sequence FROM push_deliveries`);
      const sequenceOfDelivery = new Map(deliveries.map((row) => [row.id, row]));
      const idsOfEvent = new Map<string, Set<string>>();
      for (const receipt of receiver.receipts) {
        const key = JSON.stringify(receipt.body);
        idsOfEvent.set(key, (idsOfEvent.get(key) ?? new Set<string>()).add(receipt.deliveryId));
      }
      const underTwoIds = [...idsOfEvent.entries()]
        .filter(([, ids]) => ids.size > 1 && [...ids].some((id) => sequenceOfDelivery.has(id)))
        .map(([body, ids]) => {
          const rows = [...ids].map((id) => sequenceOfDelivery.get(id));
          const taskId = rows.find((row) => row)?.task_id ?? '?';
          const run = runOf.get(taskId);
          const path = run ? `${run.fast ? 'fast run' : 'queued run'}, requeued ${run.requeue_count}×` : 'no run';
          return `task ${taskId} (${path}) sequences ${rows.map((row) => row?.event_sequence ?? '?').join(' and ')}: ${body.slice(0, 240)}`;
        });
      // Their journals (a few), with each status's timestamp.
      const stamped = (event: JournalEvent) => {
        const status = (event.response as { statusUpdate?: { status?: { timestamp?: string } } }).statusUpdate?.status;
        return `${event.sequence}:${brief(event.response as Record<string, unknown>)}${status?.timestamp ? `@${status.timestamp}` : ''}`;
      };
      const twiceTasks = [...new Set(underTwoIds.map((line) => line.split(' ')[1]!))].slice(0, 3);
      const twiceJournals = await Promise.all(twiceTasks.map(async (taskId) => `${taskId}: ${(await readJournal(pool, installation.sealer, taskId, 0)).map(stamped).join(' | ')}`));
      const fastRuns = await pool.oneFirst(sql.type(countRow)`SELECT count(*)::int AS n FROM runs WHERE started_at = created_at`);
      const facts = { fastRuns, runs: counts.database.tasks, streams: streamFacts, completedNotPushed: notPushed.length, underTwoIds, twiceJournals };
      console.info(`[faults] postgres-crash-immediate-all-fast-path streams ${JSON.stringify(facts)}`);

      expect.soft(problems, `${problems.join('\n')}\n${JSON.stringify(facts, null, 2)}\n${installation.logs(40)}`).toEqual([]);
      expect.soft(notPushed, 'every accepted task has its COMPLETED event pushed and acknowledged').toEqual([]);
      // Every accepted task COMPLETED with its result: none failed, whatever the reason.
      expect.soft(counts.completed, JSON.stringify(counts)).toBe(counts.accepted);
      expect.soft(counts.database.failed, JSON.stringify(counts.database.failureReasons)).toBe(0);
      expect.soft(counts.deliveriesUnderTwoIds, `an event reached the receiver under two delivery ids:\n${underTwoIds.join('\n')}\njournals:\n${twiceJournals.join('\n')}`).toBe(0);
      expect.soft(counts.deliveriesChanged, 'a pushed event changed or vanished from the journal').toBe(0);
      expect.soft(node.generations).toHaveLength(1);
      expect.soft(node.alive).toBe(true);
      // The fast runs in flight at the crash were written again by their live process, within seconds.
      expectRecovered(recovery ?? (await recoveryOf(pool, crashedAt, backAt, held, scriptMs)));
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );

  it('a frozen Postgres (every process stopped, connections open): /readyz still answers within its timeout and says why', async () => {
    const { postgres } = suite;
    const installation = await suite.install();
    const api = await installation.addNode('api');
    await postgres.freeze();
    let whileFrozen: Readyz;
    try {
      whileFrozen = await readyz(api.url);
    } finally {
      await postgres.thaw();
    }
    expect(whileFrozen.elapsedMs, 'readyz answered within its timeout').toBeLessThan(READYZ_ANSWER_BOUND_MS);
    expect(whileFrozen.status).toBe(503);
    expect(whileFrozen.body?.reasons?.database).toBe('no answer from the database within 2000 ms');
    expect(await until(async () => (await readyz(api.url)).status === 200, ANSWER_AGAIN_BOUND_MS, 100), 'ready again once thawed').toBe(true);
  });
});
