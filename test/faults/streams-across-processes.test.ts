import { mkdirSync, writeFileSync } from 'node:fs';
import { sql, type DatabasePool } from 'slonik';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { StreamResponse } from '../../src/protocol/wire.js';
import { readJournal, type JournalEvent } from '../../src/tasks/journal.js';
import { TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { machine, RESULTS_DIR } from './support/counts.js';
import { BACKEND } from './support/installation.js';
import { TERMINAL_STATES } from './support/load.js';
import { runsClaimedBy, SCENARIO_TIMEOUT_MS, until } from './support/scenario.js';
import { sleep } from './support/services.js';
import { useFaultSuite } from './support/suite.js';
import { SUITE_WRITE_PATH_ENV } from '../support/suite-write-path.js';

// Streams across processes, and graceful shutdown, with real `keel start --role ...` children.
//
// 1. Two API processes (A, B) and one worker process. Twenty concurrent tasks of a scripted agent
//    whose runs emit an artifact in three chunks, 500 ms apart, then answer. Each client opens
//    SendStreamingMessage (JSON-RPC, raw HTTP, so the SSE `id:` lines are visible) on A, opens a
//    plain SubscribeToTask on B at once (before the worker is done), reads A up to the first chunk
//    (ids 0, 1, 2; id 0 is the SUBMITTED Task the creating stream starts with, not a journal event),
//    drops A, and resumes on B with `Last-Event-ID` (half over JSON-RPC SubscribeToTask, half over
//    HTTP+JSON `tasks/{id}:subscribe`). A's journal events followed by B's are exactly the task's
//    a2a_events rows (payloads equal), B starts at last-read + 1 and ends with the terminal status
//    event; the plain subscription on B sees the live events within moments of their commit (the
//    worker's NOTIFY reaches B's LISTEN; without it B would only reread the journal every 15 s).
//    Who wrote what is read from the database: every connection of a child carries its role in a
//    session setting (PGOPTIONS `-c faults.node=<name>`), and triggers this file adds to its own
//    database log the writer of every a2a_events row and every run status change. The API
//    processes only insert the queued runs; the worker claims, settles and projects everything.
//
// 2. Graceful shutdown of an `all` process (grace 3 s) holding six short runs (about 2.1 s, three
//    steps with two artifact chunks) and three long ones (one 6 s step), each with a stream open
//    on it; an API process B2 stays up. SIGTERM once every run is claimed and every stream has
//    read WORKING (the short ones their first chunk too). What Keel does (src/runtime/start-keel.ts stop(), workers/run-executor.ts
//    drain()) and what the test asserts:
//    - Streams stay open through the drain and end once the process's runs are finished or
//      released and projected (A2AService's shutdown signal is raised after the drain): a short
//      run's stream on the stopping process ends with its terminal event, no resume needed; a
//      long run's stream ends after its release, having sent everything committed, and the
//      client resumes on B2 with Last-Event-ID and gets the rest, ending with the terminal
//      event; both parts together are the journal.
//    - The stopping process received the tasks and had free run slots, so it ran them itself
//      from their insert (the fast path, docs/decisions/0025-fast-path.md): each run's first
//      transition is ∅ → running on that process, with no queued step.
//    - Runs shorter than the grace period finish on the stopping process: COMPLETED with their
//      result, settled by it after SIGTERM.
//    - Runs longer than the grace are released (running → queued by the stopping process, no
//      requeue counted, not failed) and completed by a worker process started after SIGTERM:
//      claimed twice, one model reply, one completion, one answer in the journal, no duplicate.
//      The release hands the run over by a wake-up job: the other worker claims it within 2 s of
//      the release (or of its own start, if later), with the sweeper at its default 15 s.
//      Its journal reads WORKING, SUBMITTED (the release: a queued run is SUBMITTED), WORKING
//      (claimed again), the answer, COMPLETED (without the middle pair if the other worker
//      claimed before the release was projected); the resumed stream shows all of it.
//    - The listener is closed at once: a new request during the drain is refused (connection
//      refused or reset, or 503) within moments, and creates nothing. The process exits 0 within
//      grace + 5 s.

// The agents here are scripted and send no push: no model server, no receiver.
const suite = useFaultSuite({ receiver: null, model: null });

// ---------------------------------------------------------------------------------------------
// The writers' log: which process (by its faults.node session setting) wrote what.

const nodeEnv = (name: string) => ({ PGOPTIONS: `-c faults.node=${name}` });

async function logWriters(pool: DatabasePool): Promise<void> {
  await pool.query(sql.unsafe`CREATE TABLE faults_journal_writers (task_id uuid NOT NULL, sequence int NOT NULL, node text, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
  await pool.query(sql.unsafe`
    CREATE FUNCTION faults_log_journal() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO faults_journal_writers (task_id, sequence, node) VALUES (NEW.task_id, NEW.sequence, current_setting('faults.node', true));
      RETURN NEW;
    END $$`);
  await pool.query(sql.unsafe`CREATE TRIGGER faults_log_journal AFTER INSERT ON a2a_events FOR EACH ROW EXECUTE FUNCTION faults_log_journal()`);
  await pool.query(sql.unsafe`CREATE TABLE faults_run_log (run_id uuid NOT NULL, old_status text, new_status text NOT NULL, node text, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
  await pool.query(sql.unsafe`
    CREATE FUNCTION faults_log_run() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO faults_run_log (run_id, old_status, new_status, node)
      VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status, current_setting('faults.node', true));
      RETURN NEW;
    END $$`);
  await pool.query(sql.unsafe`CREATE TRIGGER faults_log_run_insert AFTER INSERT ON runs FOR EACH ROW EXECUTE FUNCTION faults_log_run()`);
  await pool.query(sql.unsafe`
    CREATE TRIGGER faults_log_run_update AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION faults_log_run()`);
}

const writerRow = z.object({ task_id: z.string(), sequence: z.number(), node: z.string().nullable(), at_ms: z.number() });
const transitionRow = z.object({ run_id: z.string(), old_status: z.string().nullable(), new_status: z.string(), node: z.string().nullable(), at_ms: z.number() });

async function journalWriters(pool: DatabasePool): Promise<Map<string, z.infer<typeof writerRow>>> {
  const rows = await pool.any(sql.type(writerRow)`SELECT task_id, sequence, node, (extract(epoch FROM at) * 1000)::float8 AS at_ms FROM faults_journal_writers`);
  return new Map(rows.map((row) => [`${row.task_id}/${row.sequence}`, row]));
}

async function runTransitions(pool: DatabasePool): Promise<Map<string, Array<z.infer<typeof transitionRow>>>> {
  const rows = await pool.any(sql.type(transitionRow)`
    SELECT run_id, old_status, new_status, node, (extract(epoch FROM at) * 1000)::float8 AS at_ms FROM faults_run_log ORDER BY at, new_status`);
  const byRun = new Map<string, Array<z.infer<typeof transitionRow>>>();
  for (const row of rows) byRun.set(row.run_id, [...(byRun.get(row.run_id) ?? []), row]);
  return byRun;
}

const transitionsText = (list: ReadonlyArray<z.infer<typeof transitionRow>> | undefined) =>
  (list ?? []).map((row) => `${row.old_status ?? '∅'}>${row.new_status}@${row.node ?? '?'}`);

const runFacts = z.object({
  id: z.string(),
  status: z.string(),
  requeue_count: z.number(),
  claims: z.number(),
  completions: z.number(),
  model_replies: z.number(),
  claimed_by: z.array(z.string()),
});

/** Per run: its status, requeues, and what its audit trail says (claims with their worker ids, replies, completions). */
async function runAudit(pool: DatabasePool, runIds: readonly string[]): Promise<Map<string, z.infer<typeof runFacts>>> {
  const rows = await pool.any(sql.type(runFacts)`
    SELECT r.id, r.status, r.requeue_count,
      (SELECT count(*)::int FROM run_events e WHERE e.run_id = r.id AND e.kind = 'claimed') AS claims,
      (SELECT count(*)::int FROM run_events e WHERE e.run_id = r.id AND e.kind = 'completed') AS completions,
      (SELECT count(*)::int FROM run_events e WHERE e.run_id = r.id AND e.kind = 'model_reply') AS model_replies,
      coalesce((SELECT array_agg(e.payload->>'worker' ORDER BY e.sequence) FROM run_events e WHERE e.run_id = r.id AND e.kind = 'claimed'), '{}') AS claimed_by
    FROM runs r WHERE r.id = ANY(${sql.array([...runIds], 'uuid')})`);
  return new Map(rows.map((row) => [row.id, row]));
}

const lastSequenceOf = (pool: DatabasePool, taskId: string) =>
  pool.oneFirst(sql.type(z.object({ last_sequence: z.number() }))`SELECT last_sequence FROM a2a_tasks WHERE id = ${taskId}`);

// ---------------------------------------------------------------------------------------------
// A raw SSE client: every frame with its `id:` and the time it arrived.

type Frame = { id: number | null; at: number; data: Record<string, unknown> };
type Binding = 'jsonrpc' | 'rest';

type SseStream = {
  status: number;
  contentType: string;
  /** The body when the answer is not a stream (an error). */
  body: string;
  frames: Frame[];
  /** How the stream ended: the server ended it, we aborted it, or the connection failed. */
  ended: Promise<'end' | 'aborted' | 'error'>;
  endedAt: () => number | null;
  abort: () => void;
};

async function openStream(url: string, init: { method?: string; headers: Record<string, string>; body?: string }): Promise<SseStream> {
  const controller = new AbortController();
  const response = await fetch(url, { method: init.method ?? 'POST', headers: init.headers, ...(init.body !== undefined ? { body: init.body } : {}), signal: controller.signal });
  const contentType = response.headers.get('content-type') ?? '';
  const frames: Frame[] = [];
  let endedAt: number | null = null;
  let aborted = false;
  if (!contentType.includes('text/event-stream')) {
    const body = await response.text();
    endedAt = Date.now();
    return { status: response.status, contentType, body, frames, ended: Promise.resolve('end'), endedAt: () => endedAt, abort: () => undefined };
  }
  const reader = response.body!.getReader();
  const ended = (async (): Promise<'end' | 'aborted' | 'error'> => {
    const decoder = new TextDecoder();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return 'end';
        buffer += decoder.decode(value, { stream: true });
        let boundary: number;
        while ((boundary = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, boundary);
          buffer = buffer.slice(boundary + 2);
          let id: number | null = null;
          const data: string[] = [];
          for (const line of block.split('\n')) {
            if (line.startsWith('id: ')) id = Number(line.slice(4));
            else if (line.startsWith('data: ')) data.push(line.slice(6));
          }
          if (data.length > 0) frames.push({ id, at: Date.now(), data: JSON.parse(data.join('\n')) as Record<string, unknown> });
        }
      }
    } catch {
      return aborted ? 'aborted' : 'error';
    } finally {
      endedAt = Date.now();
    }
  })();
  return {
    status: response.status,
    contentType,
    body: '',
    frames,
    ended,
    endedAt: () => endedAt,
    abort: () => {
      aborted = true;
      controller.abort();
    },
  };
}

const headersFor = (token: string, extra: Record<string, string> = {}) => ({
  authorization: `Bearer ${token}`,
  'a2a-version': '1.0',
  accept: 'text/event-stream',
  ...extra,
});

function sendStreaming(api: string, agent: string, token: string, text: string): Promise<SseStream> {
  return openStream(`${api}/a2a/${agent}`, {
    headers: headersFor(token, { 'content-type': 'application/json' }),
    body: JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'SendStreamingMessage',
      params: { message: { messageId: crypto.randomUUID(), role: 'ROLE_USER', parts: [{ text }] } },
    }),
  });
}

function subscribe(api: string, agent: string, token: string, taskId: string, binding: Binding, lastEventId?: number): Promise<SseStream> {
  const resume: Record<string, string> = lastEventId !== undefined ? { 'last-event-id': String(lastEventId) } : {};
  if (binding === 'rest') return openStream(`${api}/a2a/${agent}/tasks/${taskId}:subscribe`, { headers: headersFor(token, resume) });
  return openStream(`${api}/a2a/${agent}`, {
    headers: headersFor(token, { 'content-type': 'application/json', ...resume }),
    body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'SubscribeToTask', params: { id: taskId } }),
  });
}

/** The StreamResponse a frame carries (JSON-RPC wraps it in `result`). */
const responseOf = (frame: Frame, binding: Binding) => (binding === 'jsonrpc' ? (frame.data.result as Record<string, unknown> | undefined) : frame.data) ?? {};

function stateOf(response: Record<string, unknown>): string | null {
  const status = (response.statusUpdate as { status?: { state?: string } } | undefined)?.status ?? (response.task as { status?: { state?: string } } | undefined)?.status;
  return status?.state ?? null;
}

const isTerminalFrame = (frame: Frame | undefined, binding: Binding) => frame !== undefined && TERMINAL_STATES.has(stateOf(responseOf(frame, binding)) ?? '');

/** JSON as it travels: what a client can compare with what it read. */
const wire = (value: StreamResponse | Record<string, unknown>) => JSON.parse(JSON.stringify(value)) as unknown;

/** The fault suite's rules for one journal (test/faults/support/counts.ts): 1..n, n the watermark, nothing announced twice. */
function journalProblems(journal: readonly JournalEvent[], lastSequence: number): string[] {
  const problems: string[] = [];
  if (journal.some((event, index) => event.sequence !== index + 1) || journal.length !== lastSequence) problems.push(`sequence gap: ${journal.map((event) => event.sequence).join(',')} watermark ${lastSequence}`);
  let lastStatus: string | null = null;
  let ended = false;
  const artifactIds = new Set<string>();
  for (const event of journal) {
    if (ended) problems.push(`event ${event.sequence} after the terminal event`);
    if (event.kind === 'status') {
      if (event.state === lastStatus) problems.push(`status ${event.state} twice in a row at ${event.sequence}`);
      lastStatus = event.state;
      if (event.state && TERMINAL_STATES.has(event.state)) ended = true;
    } else if (event.kind === 'artifact') {
      const update = (event.response as { artifactUpdate?: { artifact: { artifactId: string }; append?: boolean } }).artifactUpdate;
      const id = update?.artifact.artifactId ?? '';
      if (!update?.append && artifactIds.has(id)) problems.push(`artifact ${id} announced again at ${event.sequence}`);
      artifactIds.add(id);
    } else {
      ended = true;
    }
  }
  if (lastStatus !== 'TASK_STATE_COMPLETED') problems.push(`journal ends ${lastStatus}`);
  return problems;
}

/** A journal in brief (`WORKING report report report …-answer COMPLETED`), for the results. */
const shapeOf = (journal: readonly JournalEvent[]) =>
  journal
    .map((event) => (event.kind === 'artifact' ? ((event.response as { artifactUpdate?: { artifact: { artifactId: string } } }).artifactUpdate?.artifact.artifactId ?? '').replace(/^.*-answer$/, 'answer') : (event.state ?? event.kind).replace('TASK_STATE_', '')))
    .join(' ');

function tally(shapes: readonly string[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const shape of shapes) counts[shape] = (counts[shape] ?? 0) + 1;
  return counts;
}

/** Every text part of the journal's artifact events, in order. */
const journalTexts = (journal: readonly JournalEvent[]) =>
  journal.flatMap((event) => ((event.response as { artifactUpdate?: { artifact: { parts: Array<{ text?: string }> } } }).artifactUpdate?.artifact.parts ?? []).map((part) => part.text ?? ''));

async function getTask(api: string, agent: string, token: string, taskId: string): Promise<Record<string, unknown>> {
  const response = await fetch(`${api}/a2a/${agent}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'GetTask', params: { id: taskId } }),
    signal: AbortSignal.timeout(10_000),
  });
  const body = (await response.json()) as { result?: Record<string, unknown>; error?: unknown };
  if (!body.result) throw new Error(`GetTask ${taskId}: ${JSON.stringify(body.error)}`);
  return body.result;
}

const artifactTextOf = (task: Record<string, unknown>) =>
  ((task.artifacts as Array<{ parts?: Array<{ text?: string }> }> | undefined) ?? []).flatMap((artifact) => (artifact.parts ?? []).map((part) => part.text ?? '')).join('');

function writeResults(name: string, result: Record<string, unknown>): void {
  const line = JSON.stringify({ scenario: name, backend: BACKEND, ...result, machine: machine() });
  mkdirSync(RESULTS_DIR, { recursive: true });
  writeFileSync(`${RESULTS_DIR}${name}-${BACKEND}.json`, `${line}\n`);
  console.info(`[faults] ${line}`);
}

const lookup = (key: string) => [{ name: 'lookup', arguments: { key } }];
const TOOLS = { KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]), KEEL_RUNS_PROVIDER_ATTEMPTS: '1' };

// ---------------------------------------------------------------------------------------------

const STEP_MS = 500;
const CHUNKS = {
  type: 'scripted',
  steps: [
    { delayMs: STEP_MS, artifact: { artifactId: 'report', name: 'report', text: 'part one; ' }, toolCalls: lookup('one') },
    { delayMs: STEP_MS, artifact: { artifactId: 'report', text: 'part two; ', append: true }, toolCalls: lookup('two') },
    { delayMs: STEP_MS, artifact: { artifactId: 'report', text: 'part three', append: true, lastChunk: true }, toolCalls: lookup('three') },
    { delayMs: STEP_MS, reply: 'report done' },
  ],
};
const TASKS = 20;

type StreamTrace = {
  index: number;
  binding: Binding;
  taskId: string;
  onA: Frame[];
  lastRead: number;
  resumed: SseStream;
  resumeEnd: 'end' | 'aborted' | 'error';
  plain: SseStream;
  plainEnd: 'end' | 'aborted' | 'error';
  plainOpenedAt: number;
};

describe(`streams across processes on the ${BACKEND} queue backend`, () => {
  it(
    'a stream opened on API A resumes on API B with Last-Event-ID; a subscription on B sees the worker\'s events live',
    async () => {
      const installation = await suite.install({
        // A lease of 6 s (heartbeat 2 s), not the fault suite's 2 s: this scenario is about streams,
        // and on a loaded CI machine a worker whose heartbeat came 2 s late had a run taken over by
        // its own reaper (fenced correctly, run again, but not the one claim this scenario checks).
        env: { ...TOOLS, KEEL_RUNS_LEASE_SECONDS: '6', KEEL_RUNS_HEARTBEAT_SECONDS: '2', KEEL_PROVIDERS: JSON.stringify({ chunks: CHUNKS }), KEEL_AGENTS: JSON.stringify([{ id: 'chunks', name: 'Chunks', provider: 'chunks', tools: ['lookup'], privacy: { answerLevel: 'full' } }]) },
      });
      const pool = await installation.pool();
      await logWriters(pool);
      const [apiA, apiB, worker] = await Promise.all([
        installation.addNode('api', nodeEnv('api-a')),
        installation.addNode('api', nodeEnv('api-b')),
        installation.addNode('worker', { ...nodeEnv('worker'), KEEL_RUNS_CONCURRENCY: '32' }),
      ]);
      const token = installation.token;
      const startedAt = Date.now();

      const oneTask = async (index: number): Promise<StreamTrace> => {
        await sleep(index * 40);
        const binding: Binding = index % 2 === 0 ? 'jsonrpc' : 'rest';
        const onA = await sendStreaming(apiA.url, 'chunks', token, `streams ${index}`);
        expect(onA.contentType, onA.body).toContain('text/event-stream');
        expect(await until(() => onA.frames.length >= 1 || onA.endedAt() !== null, 30_000), 'the first event on A').toBe(true);
        const created = responseOf(onA.frames[0]!, 'jsonrpc').task as { id: string; status: { state: string } };
        const taskId = created.id;
        // A plain subscription on B, opened before the worker is done.
        const plainOpenedAt = Date.now();
        const plain = await subscribe(apiB.url, 'chunks', token, taskId, binding);
        expect(plain.contentType, plain.body).toContain('text/event-stream');
        // Read A up to the first chunk, then drop the connection.
        expect(await until(() => onA.frames.some((frame) => (frame.id ?? 0) >= 2) || onA.endedAt() !== null, 30_000), 'the first chunk on A').toBe(true);
        onA.abort();
        await onA.ended;
        const read = [...onA.frames];
        const lastRead = read[read.length - 1]!.id!;
        const resumed = await subscribe(apiB.url, 'chunks', token, taskId, binding, lastRead);
        expect(resumed.contentType, `resume of ${taskId} after ${lastRead}: ${resumed.status} ${resumed.body}`).toContain('text/event-stream');
        const [resumeEnd, plainEnd] = await Promise.all([resumed.ended, plain.ended]);
        return { index, binding, taskId, onA: read, lastRead, resumed, resumeEnd, plain, plainEnd, plainOpenedAt };
      };

      const traces = await Promise.all(Array.from({ length: TASKS }, (_, index) => oneTask(index)));
      const clientsDoneMs = Date.now() - startedAt;

      const writers = await journalWriters(pool);
      const transitions = await runTransitions(pool);
      const audit = await runAudit(pool, traces.map((trace) => trace.taskId));
      const problems: string[] = [];
      let eventsOnA = 0;
      let eventsResumed = 0;
      let liveOnPlain = 0;
      let maxLiveLagMs = 0;
      const shapes: string[] = [];
      for (const trace of traces) {
        const { taskId, binding } = trace;
        const say = (text: string) => problems.push(`task ${trace.index} (${taskId}, ${binding}): ${text}`);
        const journal = await readJournal(pool, installation.sealer, taskId, 0);
        shapes.push(shapeOf(journal));
        for (const problem of journalProblems(journal, await lastSequenceOf(pool, taskId))) say(problem);
        const bySequence = new Map(journal.map((event) => [event.sequence, event]));
        const terminal = journal[journal.length - 1]!.sequence;

        // A: the SUBMITTED Task (id 0, not a journal event), then journal events up to the first chunk.
        const [first, ...aEvents] = trace.onA;
        if (first?.id !== 0 || stateOf(responseOf(first, 'jsonrpc')) !== 'TASK_STATE_SUBMITTED') say(`A's stream did not start with the SUBMITTED task (id ${first?.id})`);
        if (aEvents.length < 2) say(`A showed ${aEvents.length} journal events before the drop`);
        if (trace.lastRead >= terminal) say(`A read the whole task (${trace.lastRead}) before the drop: nothing left to resume`);
        eventsOnA += aEvents.length;
        // B (resumed): from last-read + 1 to the terminal event, and the stream ended after it.
        const bEvents = trace.resumed.frames;
        eventsResumed += bEvents.length;
        if (bEvents[0]?.id !== trace.lastRead + 1) say(`B resumed at ${bEvents[0]?.id}, expected ${trace.lastRead + 1}`);
        if (!isTerminalFrame(bEvents[bEvents.length - 1], binding)) say(`B's resumed stream ended without the terminal event (${stateOf(responseOf(bEvents[bEvents.length - 1]!, binding))})`);
        if (trace.resumeEnd !== 'end') say(`B's resumed stream ended by ${trace.resumeEnd}`);
        // A's part followed by B's part is the journal exactly: ids and payloads, no gap, no duplicate.
        const combined = [...aEvents.map((frame) => ({ frame, binding: 'jsonrpc' as Binding })), ...bEvents.map((frame) => ({ frame, binding }))];
        const ids = combined.map((item) => item.frame.id);
        if (JSON.stringify(ids) !== JSON.stringify(journal.map((event) => event.sequence))) say(`A+B ids ${ids.join(',')} ≠ journal ${journal.map((event) => event.sequence).join(',')}`);
        for (const { frame, binding: frameBinding } of combined) {
          const event = bySequence.get(frame.id ?? -1);
          if (!event || JSON.stringify(wire(responseOf(frame, frameBinding))) !== JSON.stringify(wire(event.response))) say(`event ${frame.id} differs from the journal`);
        }
        // Every journal event (those A showed included) was written by the worker process.
        for (const event of journal) {
          const writer = writers.get(`${taskId}/${event.sequence}`);
          if (writer?.node !== 'worker') say(`journal event ${event.sequence} written by ${writer?.node ?? 'nobody logged'}`);
        }
        // The APIs only insert the queued run; the worker claims and settles it, and its audit says so.
        const runLog = transitionsText(transitions.get(taskId));
        if (JSON.stringify(runLog) !== JSON.stringify(['∅>queued@api-a', 'queued>running@worker', 'running>completed@worker'])) say(`run transitions ${runLog.join(' ')}`);
        const facts = audit.get(taskId);
        if (!facts || facts.status !== 'completed' || facts.claims !== 1 || !facts.claimed_by[0]?.startsWith(worker.workerPrefix)) say(`run audit ${JSON.stringify(facts)}`);
        // The plain subscription on B: the task as it was (id = its watermark), then every later event live, to the end.
        const [snapshot, ...live] = trace.plain.frames;
        const snapshotTask = snapshot ? (responseOf(snapshot, binding).task as { id?: string } | undefined) : undefined;
        if (!snapshot || snapshotTask?.id !== taskId) say('the plain subscription did not start with the task');
        const liveIds = live.map((frame) => frame.id);
        const expectedLive = journal.map((event) => event.sequence).filter((sequence) => sequence > (snapshot?.id ?? 0));
        if (JSON.stringify(liveIds) !== JSON.stringify(expectedLive)) say(`plain subscription ids ${liveIds.join(',')} ≠ ${expectedLive.join(',')}`);
        if (live.length < 2) say(`plain subscription saw only ${live.length} live events`);
        if (!isTerminalFrame(live[live.length - 1], binding) || trace.plainEnd !== 'end') say(`plain subscription ended by ${trace.plainEnd} without the terminal event`);
        for (const frame of live) {
          const event = bySequence.get(frame.id ?? -1);
          if (!event || JSON.stringify(wire(responseOf(frame, binding))) !== JSON.stringify(wire(event.response))) say(`plain event ${frame.id} differs from the journal`);
          const written = writers.get(`${taskId}/${frame.id}`);
          // Live: written after the subscription was opened; its lag measures the NOTIFY from the worker to B.
          if (written && written.at_ms >= trace.plainOpenedAt) {
            liveOnPlain += 1;
            maxLiveLagMs = Math.max(maxLiveLagMs, frame.at - written.at_ms);
          }
        }
      }
      const apiWrites = [...writers.values()].filter((row) => row.node !== 'worker').length;
      const counts = {
        tasks: traces.length,
        completed: [...audit.values()].filter((facts) => facts.status === 'completed').length,
        eventsOnA,
        eventsResumed,
        journalEvents: writers.size,
        journals: tally(shapes),
        journalEventsNotByWorker: apiWrites,
        liveOnPlain,
        maxLiveLagMs: Math.round(maxLiveLagMs),
        bindings: { jsonrpc: traces.filter((trace) => trace.binding === 'jsonrpc').length, rest: traces.filter((trace) => trace.binding === 'rest').length },
        problems: problems.length,
        clientsDoneMs,
        durationMs: Date.now() - startedAt,
      };
      writeResults('streams-across-processes', counts);
      expect(problems, `${problems.join('\n')}\n${installation.logs(30)}`).toEqual([]);
      expect(counts.completed).toBe(TASKS);
      expect(apiWrites).toBe(0);
      expect(liveOnPlain).toBeGreaterThanOrEqual(TASKS * 2);
      // A woken stream reads at once; without the NOTIFY crossing processes it would reread only every 15 s.
      expect(maxLiveLagMs).toBeLessThan(3000);
    },
    SCENARIO_TIMEOUT_MS,
  );
});

// ---------------------------------------------------------------------------------------------

const SHORT_STEP_MS = 700;
const SHORT = {
  type: 'scripted',
  steps: [
    { delayMs: SHORT_STEP_MS, artifact: { artifactId: 'notes', name: 'notes', text: 'note one; ' }, toolCalls: lookup('one') },
    { delayMs: SHORT_STEP_MS, artifact: { artifactId: 'notes', text: 'note two', append: true, lastChunk: true }, toolCalls: lookup('two') },
    { delayMs: SHORT_STEP_MS, reply: 'short done' },
  ],
};
const LONG_MS = 6000;
const LONG = { type: 'scripted', steps: [{ delayMs: LONG_MS, reply: 'long done' }] };
const GRACE_SECONDS = 3;
const SHORT_TASKS = 6;
const LONG_TASKS = 3;

type ShutdownTrace = { index: number; agent: 'short' | 'long'; taskId: string; onX: SseStream; xEnd: 'end' | 'aborted' | 'error'; lastRead: number; resumed: SseStream | null; resumeEnd: string };

describe(`graceful shutdown on the ${BACKEND} queue backend`, () => {
  it(
    'SIGTERM: short runs finish and their streams end with the terminal event, long runs are released and completed elsewhere once, their streams resume on another API, exit 0',
    async () => {
      const installation = await suite.install({
        env: {
          ...TOOLS,
          KEEL_RUNS_SHUTDOWN_GRACE_SECONDS: String(GRACE_SECONDS),
          // The default sweep: a released run must reach the other worker by its wake-up job, not
          // by the sweeper restoring a lost one (which the fault suite's 0.5 s sweep would hide).
          KEEL_MAINTENANCE_SWEEP_SECONDS: '15',
          KEEL_PROVIDERS: JSON.stringify({ short: SHORT, long: LONG }),
          KEEL_AGENTS: JSON.stringify([
            { id: 'short', name: 'Short', provider: 'short', tools: ['lookup'], privacy: { answerLevel: 'full' } },
            { id: 'long', name: 'Long', provider: 'long', privacy: { answerLevel: 'full' } },
          ]),
        },
      });
      const pool = await installation.pool();
      await logWriters(pool);
      const [stopping, apiB2] = await Promise.all([installation.addNode('all', nodeEnv('all-x')), installation.addNode('api', nodeEnv('api-b2'))]);
      const token = installation.token;
      const startedAt = Date.now();

      // Every task is created by a stream on the process that will be stopped, and runs there.
      const agents: Array<'short' | 'long'> = [...Array.from({ length: SHORT_TASKS }, () => 'short' as const), ...Array.from({ length: LONG_TASKS }, () => 'long' as const)];
      const opened = await Promise.all(
        agents.map(async (agent, index) => {
          const onX = await sendStreaming(stopping.url, agent, token, `shutdown ${index}`);
          expect(onX.contentType, onX.body).toContain('text/event-stream');
          expect(await until(() => onX.frames.length >= 1, 30_000), 'the task on X').toBe(true);
          const taskId = (responseOf(onX.frames[0]!, 'jsonrpc').task as { id: string }).id;
          return { index, agent, taskId, onX };
        }),
      );
      // In flight: every run claimed by X; every stream has read WORKING, the short ones their first chunk too.
      const inFlight = await until(
        async () =>
          (await runsClaimedBy(pool, stopping)) === agents.length &&
          opened.every(({ agent, onX }) => onX.frames.some((frame) => (frame.id ?? 0) >= (agent === 'short' ? 2 : 1))),
        30_000,
      );
      expect(inFlight, `every run in flight on X\n${installation.logs(30)}`).toBe(true);

      const sigtermAt = Date.now();
      const exit = stopping.stop(30_000).then((code) => ({ code, at: Date.now() }));
      // Another worker process, started now: it takes over what X gives back.
      const takingOver = installation.addNode('worker', nodeEnv('worker-2')).then(() => Date.now());

      // The streams on X end after the drain; a client whose stream did not end with the terminal event resumes on B2, after what it read.
      const resuming: Promise<ShutdownTrace[]> = Promise.all(
        opened.map(async (entry) => {
          const xEnd = await entry.onX.ended;
          const lastRead = entry.onX.frames[entry.onX.frames.length - 1]!.id!;
          if (isTerminalFrame(entry.onX.frames[entry.onX.frames.length - 1], 'jsonrpc')) return { ...entry, xEnd, lastRead, resumed: null, resumeEnd: 'not needed' };
          const resumed = await subscribe(apiB2.url, entry.agent, token, entry.taskId, entry.index % 2 === 0 ? 'jsonrpc' : 'rest', lastRead);
          return { ...entry, xEnd, lastRead, resumed, resumeEnd: resumed.contentType.includes('text/event-stream') ? await resumed.ended : `refused: ${resumed.status} ${resumed.body}` };
        }),
      );
      resuming.catch(() => undefined); // awaited below
      // A new request during the drain: refused at once (no listener, or 503 on a kept-alive connection), never a hang.
      await sleep(300);
      const probeAt = Date.now();
      const probe = await fetch(`${stopping.url}/a2a/short`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'SendMessage', params: { message: { messageId: crypto.randomUUID(), role: 'ROLE_USER', parts: [{ text: 'too late' }] } } }),
        signal: AbortSignal.timeout(10_000),
      }).then(
        (response) => ({ outcome: `http ${response.status}`, ms: Date.now() - probeAt }),
        (error: Error) => ({ outcome: (error.cause as { code?: string } | undefined)?.code ?? error.name, ms: Date.now() - probeAt }),
      );

      const traces = await resuming;
      const exited = await exit;
      const takeOverReadyMs = (await takingOver) - sigtermAt;
      const exitMs = exited.at - sigtermAt;

      const writers = await journalWriters(pool);
      const transitions = await runTransitions(pool);
      // The all process inserts its tasks' runs claimed (the fast path), or queued and then claims
      // them when the suite runs with runs.directWrites (test/support/suite-write-path.ts).
      const startedOnAll = SUITE_WRITE_PATH_ENV.KEEL_RUNS_DIRECT_WRITES === 'true' ? ['∅>queued@all-x', 'queued>running@all-x'] : ['∅>running@all-x'];
      const audit = await runAudit(pool, traces.map((trace) => trace.taskId));
      const problems: string[] = [];
      let streamsEndedWithFinalEvent = 0;
      let streamsEndedAfterRelease = 0;
      let maxStreamCloseMs = 0;
      const shapes: string[] = [];
      for (const trace of traces) {
        const { taskId, agent } = trace;
        const binding: Binding = trace.index % 2 === 0 ? 'jsonrpc' : 'rest';
        const say = (text: string) => problems.push(`${agent} task ${trace.index} (${taskId}): ${text}`);
        const journal = await readJournal(pool, installation.sealer, taskId, 0);
        shapes.push(shapeOf(journal));
        for (const problem of journalProblems(journal, await lastSequenceOf(pool, taskId))) say(problem);
        const bySequence = new Map(journal.map((event) => [event.sequence, event]));
        const runLog = transitions.get(taskId) ?? [];
        const completion = runLog.find((row) => row.new_status === 'completed');

        // The stream on X ended cleanly after the drain: with the terminal event for a run that
        // finished on X, after the release for one that did not.
        const endedAt = trace.onX.endedAt() ?? Infinity;
        const closedMs = endedAt - sigtermAt;
        maxStreamCloseMs = Math.max(maxStreamCloseMs, closedMs);
        if (trace.xEnd !== 'end') say(`the stream on X ended by ${trace.xEnd}`);
        if (endedAt > exited.at) say('the stream on X outlived the process');
        const endedWithTerminal = isTerminalFrame(trace.onX.frames[trace.onX.frames.length - 1], 'jsonrpc');
        if (agent === 'short') {
          // Projected by the stopping process itself during its drain.
          const terminalWriter = writers.get(`${taskId}/${journal[journal.length - 1]!.sequence}`);
          if (terminalWriter?.node !== 'all-x') say(`the terminal event was written by ${terminalWriter?.node}`);
          if (endedWithTerminal) streamsEndedWithFinalEvent += 1;
          else say('the stream on X ended without the terminal event of a run that finished on X');
        } else {
          const release = runLog.find((row) => row.old_status === 'running' && row.new_status === 'queued');
          if (endedWithTerminal) say('the stream on X showed a terminal event for a released run');
          if (!release || endedAt < release.at_ms) say(`the stream on X ended ${closedMs} ms after SIGTERM, before the run's release`);
          else streamsEndedAfterRelease += 1;
        }
        // The rest on B2, from last-read + 1 to the terminal event; both parts together are the journal.
        const rest = trace.resumed?.frames ?? [];
        if (trace.resumed) {
          if (trace.resumeEnd !== 'end') say(`resume on B2: ${trace.resumeEnd}`);
          if (rest[0]?.id !== trace.lastRead + 1) say(`B2 resumed at ${rest[0]?.id}, expected ${trace.lastRead + 1}`);
          if (!isTerminalFrame(rest[rest.length - 1], binding)) say('the resumed stream ended without the terminal event');
        }
        const [first, ...xEvents] = trace.onX.frames;
        if (first?.id !== 0) say(`the stream on X started at ${first?.id}`);
        const combined = [...xEvents.map((frame) => ({ frame, binding: 'jsonrpc' as Binding })), ...rest.map((frame) => ({ frame, binding }))];
        const ids = combined.map((item) => item.frame.id);
        if (JSON.stringify(ids) !== JSON.stringify(journal.map((event) => event.sequence))) say(`X+B2 ids ${ids.join(',')} ≠ journal ${journal.map((event) => event.sequence).join(',')}`);
        for (const { frame, binding: frameBinding } of combined) {
          const event = bySequence.get(frame.id ?? -1);
          if (!event || JSON.stringify(wire(responseOf(frame, frameBinding))) !== JSON.stringify(wire(event.response))) say(`event ${frame.id} differs from the journal`);
        }

        // The result, in the database's journal and for a client asking B2.
        const want = agent === 'short' ? ['note one; ', 'note two', 'short done'] : ['long done'];
        const texts = journalTexts(journal);
        if (JSON.stringify(texts) !== JSON.stringify(want)) say(`journal artifacts ${JSON.stringify(texts)}`);
        const task = await getTask(apiB2.url, agent, token, taskId);
        if ((task.status as { state: string }).state !== 'TASK_STATE_COMPLETED' || !want.every((text) => artifactTextOf(task).includes(text))) say(`GetTask shows ${JSON.stringify(task.status)} ${artifactTextOf(task)}`);

        const facts = audit.get(taskId);
        const log = transitionsText(runLog);
        if (agent === 'short') {
          // Finished on X within the grace period, after SIGTERM.
          if (JSON.stringify(log) !== JSON.stringify([...startedOnAll, 'running>completed@all-x'])) say(`run transitions ${log.join(' ')}`);
          if (!completion || completion.at_ms < sigtermAt || completion.at_ms > exited.at) say(`completed at ${completion ? completion.at_ms - sigtermAt : 'never'} ms after SIGTERM`);
          if (!facts || facts.claims !== 1 || facts.completions !== 1 || facts.requeue_count !== 0) say(`run audit ${JSON.stringify(facts)}`);
        } else {
          // Released by X (back to queued, not failed, no requeue counted), completed once by the other worker.
          if (JSON.stringify(log) !== JSON.stringify([...startedOnAll, 'running>queued@all-x', 'queued>running@worker-2', 'running>completed@worker-2'])) say(`run transitions ${log.join(' ')}`);
          const released = runLog.find((row) => row.old_status === 'running' && row.new_status === 'queued');
          if (!released || released.at_ms < sigtermAt + GRACE_SECONDS * 1000 - 500) say(`released ${released ? released.at_ms - sigtermAt : 'never'} ms after SIGTERM`);
          // Handed over at once: claimed as soon as both the release and the other worker were there.
          const reclaimed = runLog.find((row) => row.node === 'worker-2' && row.new_status === 'running');
          const handOverMs = released && reclaimed ? reclaimed.at_ms - Math.max(released.at_ms, sigtermAt + takeOverReadyMs) : Infinity;
          if (handOverMs > 2000) say(`claimed by the other worker ${Math.round(handOverMs)} ms after the release and its start`);
          if (!facts || facts.status !== 'completed' || facts.claims !== 2 || facts.completions !== 1 || facts.model_replies !== 1 || facts.requeue_count !== 0) say(`run audit ${JSON.stringify(facts)}`);
        }
      }
      const tasksInDatabase = await pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_tasks`);
      const counts = {
        tasks: traces.length,
        short: SHORT_TASKS,
        long: LONG_TASKS,
        graceSeconds: GRACE_SECONDS,
        completed: [...audit.values()].filter((facts) => facts.status === 'completed').length,
        completedOnStoppingProcess: traces.filter((trace) => transitions.get(trace.taskId)?.some((row) => row.new_status === 'completed' && row.node === 'all-x')).length,
        released: traces.filter((trace) => transitions.get(trace.taskId)?.some((row) => row.old_status === 'running' && row.new_status === 'queued')).length,
        takeOverReadyMs,
        /** From each release to the other worker's claim, in ms. */
        releasedToReclaimedMs: traces
          .filter((trace) => trace.agent === 'long')
          .map((trace) => {
            const log = transitions.get(trace.taskId) ?? [];
            const released = log.find((row) => row.old_status === 'running' && row.new_status === 'queued');
            const reclaimed = log.find((row) => row.node === 'worker-2' && row.new_status === 'running');
            return released && reclaimed ? Math.round(reclaimed.at_ms - released.at_ms) : null;
          }),
        releasedAfterSigtermMs: traces
          .filter((trace) => trace.agent === 'long')
          .map((trace) => Math.round((transitions.get(trace.taskId)?.find((row) => row.old_status === 'running' && row.new_status === 'queued')?.at_ms ?? NaN) - sigtermAt)),
        completedByOtherWorker: traces.filter((trace) => transitions.get(trace.taskId)?.some((row) => row.new_status === 'completed' && row.node === 'worker-2')).length,
        failed: [...audit.values()].filter((facts) => facts.status === 'failed').length,
        journals: tally(shapes),
        streamsEndedWithFinalEvent,
        streamsEndedAfterRelease,
        maxStreamCloseMs,
        resumed: traces.filter((trace) => trace.resumeEnd === 'end').length,
        requestDuringShutdown: probe,
        tasksInDatabase,
        exitCode: exited.code,
        exitMs,
        problems: problems.length,
        durationMs: Date.now() - startedAt,
      };
      writeResults('graceful-shutdown', counts);
      expect(problems, `${problems.join('\n')}\n${installation.logs(30)}`).toEqual([]);
      expect(exited.code).toBe(0);
      expect(exitMs).toBeLessThan((GRACE_SECONDS + 5) * 1000);
      // The drain waited for the long runs: the process did not exit before the grace period ended.
      expect(exitMs).toBeGreaterThanOrEqual(GRACE_SECONDS * 1000 - 200);
      expect(probe.outcome.startsWith('http 2'), `request during shutdown: ${probe.outcome}`).toBe(false);
      expect(probe.ms).toBeLessThan(2000);
      expect(tasksInDatabase).toBe(agents.length);
      expect(counts.completedOnStoppingProcess).toBe(SHORT_TASKS);
      expect(counts.released).toBe(LONG_TASKS);
      expect(counts.completedByOtherWorker).toBe(LONG_TASKS);
      expect(counts.completed).toBe(agents.length);
      expect(streamsEndedWithFinalEvent).toBe(SHORT_TASKS);
      expect(streamsEndedAfterRelease).toBe(LONG_TASKS);
      expect(counts.resumed).toBe(LONG_TASKS);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
