import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, release, totalmem } from 'node:os';
import { fileURLToPath } from 'node:url';
import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import type { Sealer } from '../../../src/sealing/sealer.js';
import { eventContext } from '../../../src/tasks/journal.js';
import { getTaskRowById, openSealed, taskView } from '../../../src/tasks/task-repository.js';
import type { StreamResponse, Message } from '../../../src/protocol/wire.js';
import { TERMINAL_STATES, artifactText, carries, type Load, type LoadOptions } from './load.js';
import type { PushReceiver } from './peers.js';
import { sleep } from './services.js';

// The end of every fault scenario: counts from the clients (what they were told) and from the
// database (what Keel holds), written as one JSON line to test/faults/results/<scenario>-<backend>.json
// and printed, for docs/reliability.md.

export const RESULTS_DIR = fileURLToPath(new URL('../results/', import.meta.url));

export type ScenarioCounts = {
  scenario: string;
  backend: string;
  /** Tasks the clients set out to send. */
  planned: number;
  /** Tasks a client was told were accepted (an answer with a task id). */
  accepted: number;
  /** Accepted tasks completed with their own result, in the database, the journal and GetTask. */
  completed: number;
  /** Accepted tasks failed with a reason (a termination reason and a status message). */
  failed: number;
  /** Accepted tasks that are neither: must be 0. */
  lost: number;
  /** Journal events announced twice (same state twice in a row, a second terminal, anything after it, a repeated artifact): must be 0. */
  duplicateEvents: number;
  /** Journals whose sequences are not 1..n or disagree with the task's watermark: must be 0. */
  sequenceGaps: number;
  /** (config, journal event) pairs of tasks with a push config. */
  deliveriesExpected: number;
  /** Pairs the receiver never acknowledged (2xx written) or the database does not hold as delivered: must be 0. */
  deliveriesMissing: number;
  /** Requests that reached the receiver before an earlier event of the same config was acknowledged: must be 0. */
  deliveriesOutOfOrder: number;
  /** Events (same task, same body) that reached the receiver under more than one delivery id: must be 0. */
  deliveriesUnderTwoIds: number;
  /** Delivery ids whose request carried something other than the journal event they name now (it changed or vanished): must be 0. */
  deliveriesChanged: number;
  dependencies: number;
  /** Dependencies resolved (or runs resumed for one) more than once: must be 0. */
  dependenciesResolvedTwice: number;
  client: { accepted: number; completed: number; failed: number; lost: number; shownWithoutResult: number; notAccepted: number; resent: number };
  database: {
    tasks: number;
    /** Tasks in the database that no client heard of (a send whose answer was lost); they must end too. */
    unacknowledged: number;
    completed: number;
    failed: number;
    unfinished: number;
    unprojected: number;
    journalWithoutResult: number;
    requeued: number;
    failureReasons: Record<string, number>;
  };
  faults: Record<string, unknown>;
  durationMs: number;
  machine: string;
};

export function machine(): string {
  const cpu = cpus();
  return `${cpu.length} × ${cpu[0]?.model ?? 'cpu'}, ${Math.round(totalmem() / 2 ** 30)} GiB RAM, Linux ${release()}, Node ${process.version}`;
}

const taskSummary = z.object({
  id: z.string(),
  agent: z.string(),
  state: z.string(),
  projected_state: z.string(),
  last_sequence: z.number(),
  projected_revision: z.number(),
  run_revision: z.number(),
  requeue_count: z.number(),
  termination_reason: z.string().nullable(),
});
const eventRow = z.object({ task_id: z.string(), sequence: z.number(), kind: z.string(), state: z.string().nullable(), payload: z.instanceof(Buffer) });
const configRow = z.object({ task_id: z.string(), id: z.string(), url: z.string() });
const deliveryRow = z.object({ id: z.string(), task_id: z.string(), config_id: z.string(), event_sequence: z.number(), state: z.string() });

/** Waits until the database owes nothing: every task terminal in the view and the journal, no projection debt, no pending delivery. */
export async function waitForQuiet(pool: DatabasePool, timeoutMs = 90_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      const open = await pool.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT ((SELECT count(*) FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
                 WHERE t.projected_state NOT IN ('TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED')
                    OR r.revision > t.projected_revision)
              + (SELECT count(*) FROM push_deliveries WHERE state = 'pending'))::int AS n`);
      if (open === 0) return true;
    } catch {
      // the database may be coming back
    }
    await sleep(250);
  }
  return false;
}

type Expected = LoadOptions['expected'];

export type CountInput = {
  scenario: string;
  backend: string;
  load: Load;
  pool: DatabasePool;
  sealer: Sealer;
  expected: Expected;
  receiver?: PushReceiver | null;
  startedAt: number;
  faults?: Record<string, unknown>;
  dependencies?: { count: number; resolvedTwice: number };
};

export async function countScenario(input: CountInput): Promise<ScenarioCounts> {
  const { pool, sealer, load } = input;
  const tasks = await pool.any(sql.type(taskSummary)`
    SELECT t.id, t.agent, t.state, t.projected_state, t.last_sequence, t.projected_revision, r.revision AS run_revision, r.requeue_count, r.termination_reason
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id`);
  const events = await pool.any(sql.type(eventRow)`SELECT task_id, sequence, kind, state, payload FROM a2a_events ORDER BY task_id, sequence`);
  const journals = new Map<string, Array<z.infer<typeof eventRow> & { response: StreamResponse }>>();
  for (const event of events) {
    const opened = sealer.openJson<StreamResponse>(eventContext(event.task_id, event.sequence), event.payload);
    if (!opened.ok) throw new Error(`journal event ${event.task_id}/${event.sequence} cannot be opened`);
    const list = journals.get(event.task_id) ?? [];
    list.push({ ...event, response: opened.value });
    journals.set(event.task_id, list);
  }

  // ---- the database's view of each task ----
  const dbVerdict = new Map<string, 'completed' | 'failed' | 'unfinished' | 'wrong'>();
  const failureReasons: Record<string, number> = {};
  let unprojected = 0;
  let journalWithoutResult = 0;
  let duplicateEvents = 0;
  let sequenceGaps = 0;
  for (const task of tasks) {
    if (task.run_revision > task.projected_revision) unprojected += 1;
    const journal = journals.get(task.id) ?? [];
    // Sequences 1..n, n the watermark.
    if (journal.some((event, index) => event.sequence !== index + 1) || journal.length !== task.last_sequence) sequenceGaps += 1;
    let lastStatus: string | null = null;
    let ended = false;
    const artifactIds = new Set<string>();
    for (const event of journal) {
      if (ended) duplicateEvents += 1;
      if (event.kind === 'status') {
        if (event.state === lastStatus) duplicateEvents += 1;
        lastStatus = event.state;
        if (event.state && TERMINAL_STATES.has(event.state)) ended = true;
      } else if (event.kind === 'artifact') {
        const update = (event.response as { artifactUpdate?: { artifact: { artifactId: string }; append?: boolean } }).artifactUpdate;
        const id = update?.artifact.artifactId ?? '';
        if (!update?.append && artifactIds.has(id)) duplicateEvents += 1;
        artifactIds.add(id);
      } else {
        ended = true;
      }
    }
    const row = await getTaskRowById(pool, task.id);
    if (!row) continue;
    const terminal = TERMINAL_STATES.has(task.state) && TERMINAL_STATES.has(task.projected_state) && task.state === task.projected_state;
    if (!terminal) {
      dbVerdict.set(task.id, 'unfinished');
      continue;
    }
    if (task.state === 'TASK_STATE_COMPLETED') {
      const history = openSealed<Message[]>(sealer, row.id, 'history', row.history, []);
      const sent = (history[0]?.parts ?? []).map((part) => (part as { text?: string }).text ?? '').join('');
      const want = input.expected(task.agent, sent);
      const view = taskView(sealer, row, { historyLength: 0 });
      const inView = carries(artifactText(view as unknown as Record<string, unknown>), want);
      const escaped = (Array.isArray(want) ? want : [want]).map((text) => JSON.stringify(text).slice(1, -1));
      const inJournal = journal.some((event) => event.kind === 'artifact' && carries(JSON.stringify(event.response), escaped));
      if (!inJournal) journalWithoutResult += 1;
      dbVerdict.set(task.id, inView && inJournal ? 'completed' : 'wrong');
    } else {
      const view = taskView(sealer, row, { historyLength: 0 });
      const reason = task.termination_reason ?? 'none';
      failureReasons[reason] = (failureReasons[reason] ?? 0) + 1;
      const said = (view.status.message?.parts ?? []).some((part) => Boolean((part as { text?: string }).text));
      dbVerdict.set(task.id, task.termination_reason && said ? 'failed' : 'wrong');
    }
  }

  // ---- push deliveries: every (config, event) acknowledged by the receiver and delivered in the database, in order ----
  let deliveriesExpected = 0;
  let deliveriesMissing = 0;
  let deliveriesOutOfOrder = 0;
  let deliveriesUnderTwoIds = 0;
  let deliveriesChanged = 0;
  const receiver = input.receiver ?? null;
  if (receiver) {
    // The receiver's configs only: a delegation's remote pushes to the installation's own inbox.
    const configs = await pool.any(sql.type(configRow)`SELECT task_id, id, url FROM push_configs WHERE deleted_at IS NULL AND url = ${receiver.url}`);
    const deliveries = await pool.any(sql.type(deliveryRow)`SELECT id, task_id, config_id, event_sequence, state FROM push_deliveries`);
    const byKey = new Map(deliveries.map((row) => [`${row.task_id}/${row.config_id}/${row.event_sequence}`, row]));
    const sequenceOf = new Map(deliveries.map((row) => [row.id, row]));
    const receiptsOf = new Map<string, PushReceiver['receipts']>();
    for (const receipt of receiver.receipts) {
      const list = receiptsOf.get(receipt.deliveryId) ?? [];
      list.push(receipt);
      receiptsOf.set(receipt.deliveryId, list);
    }
    for (const config of configs) {
      const journal = journals.get(config.task_id) ?? [];
      const firstAck = new Map<number, number>();
      const arrivals: Array<{ sequence: number; at: number }> = [];
      for (const event of journal) {
        deliveriesExpected += 1;
        const row = byKey.get(`${config.task_id}/${config.id}/${event.sequence}`);
        const receipts = row ? (receiptsOf.get(row.id) ?? []) : [];
        const acked = receipts.filter((receipt) => receipt.ackedAt !== null).map((receipt) => receipt.ackedAt!);
        if (!row || row.state !== 'delivered' || acked.length === 0) {
          deliveriesMissing += 1;
          continue;
        }
        firstAck.set(event.sequence, Math.min(...acked));
        for (const receipt of receipts) arrivals.push({ sequence: sequenceOf.get(receipt.deliveryId)!.event_sequence, at: receipt.at });
      }
      // No request for an event before every earlier event of the config was acknowledged.
      for (const arrival of arrivals) {
        const early = journal.some((event) => event.sequence < arrival.sequence && (firstAck.get(event.sequence) ?? Infinity) > arrival.at);
        if (early) deliveriesOutOfOrder += 1;
      }
    }
    // What the receiver saw, whatever the database says now: a receiver deduplicates by delivery id,
    // so one event must never arrive under two ids, and an id must always carry the journal event
    // it names (a pushed event, like a streamed one, must not change or vanish afterwards). The
    // receiver is shared by the file's installations: only this installation's tasks count.
    const taskIds = new Set(tasks.map((task) => task.id));
    const idsOfEvent = new Map<string, Set<string>>();
    const changed = new Set<string>();
    for (const receipt of receiver.receipts) {
      const taskId = pushedTaskId(receipt.body);
      if (taskId === null || !taskIds.has(taskId)) continue;
      const body = JSON.stringify(receipt.body);
      const ids = idsOfEvent.get(`${taskId}/${body}`) ?? new Set<string>();
      ids.add(receipt.deliveryId);
      idsOfEvent.set(`${taskId}/${body}`, ids);
      const row = sequenceOf.get(receipt.deliveryId);
      const event = row?.task_id === taskId ? journals.get(taskId)?.find((candidate) => candidate.sequence === row.event_sequence) : undefined;
      if (!event || JSON.stringify(event.response) !== body) changed.add(receipt.deliveryId);
    }
    deliveriesUnderTwoIds = [...idsOfEvent.values()].filter((ids) => ids.size > 1).length;
    deliveriesChanged = changed.size;
  }

  // ---- the clients' view ----
  const records = load.records;
  const acceptedRecords = records.filter((record) => record.taskId !== null);
  const clientCompleted = acceptedRecords.filter(
    (record) => record.finalState === 'TASK_STATE_COMPLETED' && !record.shownWithoutResult && carries(record.finalText ?? '', input.expected(record.agent, record.text)),
  );
  const clientFailed = acceptedRecords.filter((record) => record.finalState && record.finalState !== 'TASK_STATE_COMPLETED' && TERMINAL_STATES.has(record.finalState) && record.finalReason);
  const clientIds = new Set(acceptedRecords.map((record) => record.taskId!));
  const completedIds = new Set(clientCompleted.map((record) => record.taskId!));
  const failedIds = new Set(clientFailed.map((record) => record.taskId!));

  // An accepted task counts as completed (or failed) only when the client and the database agree.
  let completed = 0;
  let failed = 0;
  for (const id of clientIds) {
    const verdict = dbVerdict.get(id);
    if (verdict === 'completed' && completedIds.has(id)) completed += 1;
    else if (verdict === 'failed' && failedIds.has(id)) failed += 1;
  }
  const verdicts = [...dbVerdict.values()];
  const tally = (kind: string) => verdicts.filter((verdict) => verdict === kind).length;
  const dependencies = input.dependencies ?? { count: 0, resolvedTwice: 0 };

  const counts: ScenarioCounts = {
    scenario: input.scenario,
    backend: input.backend,
    planned: records.length,
    accepted: acceptedRecords.length,
    completed,
    failed,
    lost: acceptedRecords.length - completed - failed,
    duplicateEvents,
    sequenceGaps,
    deliveriesExpected,
    deliveriesMissing,
    deliveriesOutOfOrder,
    deliveriesUnderTwoIds,
    deliveriesChanged,
    dependencies: dependencies.count,
    dependenciesResolvedTwice: dependencies.resolvedTwice,
    client: {
      accepted: acceptedRecords.length,
      completed: clientCompleted.length,
      failed: clientFailed.length,
      lost: acceptedRecords.length - clientCompleted.length - clientFailed.length,
      shownWithoutResult: records.filter((record) => record.shownWithoutResult).length,
      notAccepted: records.length - acceptedRecords.length,
      resent: records.reduce((sum, record) => sum + Math.max(0, record.sends - 1), 0),
    },
    database: {
      tasks: tasks.length,
      unacknowledged: tasks.filter((task) => !clientIds.has(task.id)).length,
      completed: tally('completed'),
      failed: tally('failed'),
      unfinished: tally('unfinished') + tally('wrong'),
      unprojected,
      journalWithoutResult,
      requeued: tasks.filter((task) => task.requeue_count > 0).length,
      failureReasons,
    },
    faults: input.faults ?? {},
    durationMs: Date.now() - input.startedAt,
    machine: machine(),
  };
  mkdirSync(RESULTS_DIR, { recursive: true });
  const line = JSON.stringify(counts);
  writeFileSync(`${RESULTS_DIR}${input.scenario}-${input.backend}.json`, `${line}\n`);
  console.info(`[faults] ${line}`);
  return counts;
}

/** The task a pushed body (a StreamResponse) is about, or null when it names none. */
function pushedTaskId(body: unknown): string | null {
  if (typeof body !== 'object' || body === null) return null;
  for (const value of Object.values(body as Record<string, unknown>)) {
    const taskId = (value as { taskId?: unknown } | null)?.taskId;
    if (typeof taskId === 'string') return taskId;
  }
  return null;
}

/** The suite's verdict on a scenario's counts. */
export function problemsOf(counts: ScenarioCounts): string[] {
  const problems: string[] = [];
  if (counts.accepted < 200) problems.push(`only ${counts.accepted} tasks accepted (at least 200 expected)`);
  for (const key of ['lost', 'duplicateEvents', 'sequenceGaps', 'deliveriesMissing', 'deliveriesOutOfOrder', 'deliveriesUnderTwoIds', 'deliveriesChanged', 'dependenciesResolvedTwice'] as const) {
    if (counts[key] !== 0) problems.push(`${key}: ${counts[key]}`);
  }
  if (counts.client.shownWithoutResult !== 0) problems.push(`shownWithoutResult: ${counts.client.shownWithoutResult}`);
  if (counts.database.unfinished !== 0) problems.push(`unfinished in the database: ${counts.database.unfinished}`);
  if (counts.database.unprojected !== 0) problems.push(`unprojected revisions: ${counts.database.unprojected}`);
  return problems;
}
