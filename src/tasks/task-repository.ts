import { sql, type CommonQueryMethods, type IdentifierSqlToken } from 'slonik';
import { z } from 'zod';
import type { TerminationReason } from '../../machines/run.machine.js';
import { applyLevel } from '../privacy/apply-level.js';
import type { PrivacyLevel } from '../privacy/privacy-level.js';
import type { Sealer } from '../sealing/sealer.js';
import { isoTime, type Artifact, type Message, type Task, type TaskState } from '../protocol/wire.js';
import { failureMetadata, failureStatusMessage } from './failure-status.js';
import { countTasks } from './task-counts.js';
import { rowShape, type ShapedRow } from '../db/row-shape.js';
import { isUuid } from '../db/uuid.js';

// a2a_tasks and contexts: the task view GetTask and ListTasks read. The state column follows the
// run's status (a trigger, same transaction); content columns are sealed at the task's answer
// level; the projector keeps the journal watermark.

export const taskColumnContext = (taskId: string, column: 'status_message' | 'artifacts' | 'history') => ({ table: 'a2a_tasks', column, rowId: taskId });

export const taskRow = z.object({
  id: z.string(),
  context_id: z.string(),
  owner: z.string(),
  agent: z.string(),
  run_id: z.string(),
  state: z.string(),
  status_timestamp: z.number(),
  status_message: z.instanceof(Buffer).nullable(),
  artifacts: z.instanceof(Buffer).nullable(),
  history: z.instanceof(Buffer).nullable(),
  answer_level: z.string(),
  metadata: z.record(z.unknown()),
  projected_revision: z.number(),
  last_sequence: z.number(),
  projected_state: z.string(),
  direct_message: z.boolean(),
  created_at: z.number(),
  // From the run: why it ended, for status messages derived without content.
  termination_reason: z.string().nullable(),
  failure_detail: z.record(z.unknown()).nullable(),
});
export type TaskRow = z.infer<typeof taskRow>;

const TASK_SELECT = sql.fragment`
  SELECT t.id, t.context_id, t.owner, t.agent, t.run_id, t.state, t.status_timestamp, t.status_message, t.artifacts,
    t.history, t.answer_level, t.metadata, t.projected_revision, t.last_sequence, t.projected_state, t.direct_message, t.created_at,
    r.termination_reason, r.failure_detail
  FROM a2a_tasks t JOIN runs r ON r.id = t.run_id`;

export async function ensureContext(db: CommonQueryMethods, owner: string, contextId: string): Promise<void> {
  await db.query(sql.unsafe`
    INSERT INTO contexts (owner, id) VALUES (${owner}, ${contextId})
    ON CONFLICT (owner, id) DO UPDATE SET updated_at = now()`);
}

export type NewTask = {
  id: string;
  contextId: string;
  owner: string;
  agent: string;
  answerLevel: PrivacyLevel;
  history: Message[];
  metadata: Record<string, unknown>;
  /** `history` sealed already (sealTaskHistory): the fast path keeps the bytes it wrote, to answer from them. */
  sealedHistory?: Buffer | null;
  /**
   * The key of the message that created the task (its messageId or Idempotency-Key) and the
   * request's fingerprint (src/a2a/message-fingerprint.ts): a second INSERT with the key inserts
   * nothing (sql/0028). None for a task Keel creates itself.
   */
  messageKey?: string | null;
  messageFingerprint?: Buffer | null;
};

/** A task whose run its process claimed at insert (the fast path): WORKING since `at`, its WORKING event written with it or not. */
export type TaskStart = { at: number; journaled: { revision: number; lastSequence: number } | null };

/**
 * One task's row of an INSERT: SUBMITTED beside a QUEUED run, or WORKING since `start.at` beside
 * a run its process claimed at insert (the fast path; created then too, as its run is). The state
 * column follows the run's status from then on (a trigger). The watermark says what the journal
 * holds: nothing yet, or the WORKING event the same statement writes (`start.journaled`).
 */
export function taskValues(sealer: Sealer, task: NewTask, start: TaskStart | null = null) {
  const history = task.sealedHistory !== undefined ? task.sealedHistory : sealTaskHistory(sealer, task);
  const journaled = start?.journaled ?? null;
  return TASK_ROW.row({
    id: task.id,
    context_id: task.contextId,
    owner: task.owner,
    agent: task.agent,
    state: start === null ? 'TASK_STATE_SUBMITTED' : 'TASK_STATE_WORKING',
    answer_level: task.answerLevel,
    history,
    metadata: JSON.stringify(task.metadata),
    at: start?.at ?? null,
    projected_revision: journaled?.revision ?? 0,
    last_sequence: journaled?.lastSequence ?? 0,
    projected_state: journaled ? 'TASK_STATE_WORKING' : 'TASK_STATE_SUBMITTED',
    message_key: task.messageKey ?? null,
    message_fingerprint: task.messageFingerprint ?? null,
  });
}

/** A task's row from `taskValues`, as the INSERT's unnest names and types it (row-shape.ts). */
const TASK_ROW = rowShape([
  ['id', 'uuid'],
  ['context_id', 'text'],
  ['owner', 'uuid'],
  ['agent', 'text'],
  ['state', 'text'],
  ['answer_level', 'text'],
  ['history', 'bytea'],
  ['metadata', 'jsonb'],
  ['at', 'float8'],
  ['projected_revision', 'int8'],
  ['last_sequence', 'int4'],
  ['projected_state', 'text'],
  ['message_key', 'text'],
  ['message_fingerprint', 'bytea'],
]);

/** How many cells a row from `taskValues` has. */
export const TASK_COLUMNS = TASK_ROW.width;

/**
 * The INSERT of task rows (from `taskValues`), as a statement of its own or a CTE of a larger one:
 * the rows as arrays, one text for any number of tasks. A task is created (and its status stamped)
 * at the transaction's time, or at its fast run's start. A task whose message key its owner used
 * before (for a task or a follow-up) is not inserted: the unique index decides, waiting for a
 * concurrent insert of the key to commit or roll back (decision 0064). Callers insert what hangs
 * off a task only for the ids the INSERT returns.
 */
export function insertTasksStatement(rows: readonly ShapedRow[]) {
  return sql.fragment`INSERT INTO a2a_tasks (id, context_id, owner, agent, run_id, state, answer_level, history, metadata, status_timestamp,
      projected_revision, last_sequence, projected_state, created_at, message_key, message_fingerprint)
    SELECT v.id, v.context_id, v.owner, v.agent, v.id, v.state, v.answer_level, v.history, v.metadata,
      coalesce(to_timestamp(v.at / 1000.0), now()), v.projected_revision, v.last_sequence, v.projected_state, coalesce(to_timestamp(v.at / 1000.0), now()),
      v.message_key, v.message_fingerprint
    FROM ${TASK_ROW.unnest(rows, 'v')}
    WHERE v.message_key IS NULL OR NOT EXISTS (SELECT 1 FROM a2a_follow_up_keys f WHERE f.owner = v.owner AND f.message_key = v.message_key)
    ON CONFLICT (owner, message_key) WHERE message_key IS NOT NULL DO NOTHING`;
}

/** A new task's history as its row stores it: kept at the task's answer level, sealed. */
export function sealTaskHistory(sealer: Sealer, task: Pick<NewTask, 'id' | 'answerLevel' | 'history'>): Buffer | null {
  return sealHistory(sealer, task.id, task.answerLevel, task.history);
}

function sealHistory(sealer: Sealer, taskId: string, level: PrivacyLevel, history: Message[]): Buffer | null {
  const kept = keepAtLevel(level, history);
  return kept === undefined ? null : sealTaskColumn(sealer, taskId, 'history', kept);
}

/**
 * What this process sealed into a task column, by the sealed bytes. A row it wrote and answers
 * from (the task a blocking SendMessage's completion committed) is shown from the value it sealed
 * instead of opening the bytes again: each opening is two AES-GCM operations and a JSON parse of
 * what the process held a moment before. Only a buffer sealed here is known (a row read from the
 * database holds buffers of its own), and an entry lives exactly as long as its buffer does. The
 * value is shared by every reader of that buffer, as a parsed one is not: readers never change
 * what they open, and the sealers' callers never change a value once it is sealed.
 */
const sealedHere = new WeakMap<Buffer, unknown>();

function sealTaskColumn(sealer: Sealer, taskId: string, column: 'status_message' | 'artifacts' | 'history', value: unknown): Buffer {
  const sealed = sealer.sealJson(taskColumnContext(taskId, column), value);
  sealedHere.set(sealed, value);
  return sealed;
}

/** Content kept at the answer level: full as is, redacted masked; nothing at metadata or none (a task never stores summaries in place of messages). */
function keepAtLevel<T>(level: PrivacyLevel, value: T): T | undefined {
  if (level === 'full') return value;
  if (level === 'redacted') return applyLevel('redacted', value) as T;
  return undefined;
}

export async function getTaskRow(db: CommonQueryMethods, owner: string, taskId: string): Promise<TaskRow | null> {
  if (!isUuid(taskId)) return null;
  return db.maybeOne(sql.type(taskRow)`${TASK_SELECT} WHERE t.id = ${taskId} AND t.owner = ${owner}`);
}

/** A task row's head with its row version (the tuple's xmin: every committed write of the row changes it). */
export const taskHeadRow = taskRow.omit({ status_message: true, artifacts: true, history: true }).extend({ version: z.string() });
export type VersionedTaskHead = z.infer<typeof taskHeadRow>;
export type VersionedTaskRow = TaskRow & { version: string };

/**
 * The task's head and row version, without its sealed content: a reader that has this version's
 * content opened already (task-revision-cache.ts) reads nothing more. The run's columns the view
 * uses are in the head; they only change with the run's status, which the task row follows.
 */
export async function getTaskHead(db: CommonQueryMethods, owner: string, taskId: string): Promise<VersionedTaskHead | null> {
  if (!isUuid(taskId)) return null;
  return db.maybeOne(sql.type(taskHeadRow)`
    SELECT t.id, t.context_id, t.owner, t.agent, t.run_id, t.state, t.status_timestamp, t.answer_level, t.metadata,
      t.projected_revision, t.last_sequence, t.projected_state, t.direct_message, t.created_at,
      r.termination_reason, r.failure_detail, t.xmin::text AS version
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
    WHERE t.id = ${taskId} AND t.owner = ${owner}`);
}

/** The whole task row with its row version (the content a head's version names, or a newer one). */
export async function getVersionedTaskRow(db: CommonQueryMethods, taskId: string): Promise<VersionedTaskRow | null> {
  if (!isUuid(taskId)) return null;
  return db.maybeOne(sql.type(taskRow.extend({ version: z.string() }))`
    SELECT t.id, t.context_id, t.owner, t.agent, t.run_id, t.state, t.status_timestamp, t.status_message, t.artifacts,
      t.history, t.answer_level, t.metadata, t.projected_revision, t.last_sequence, t.projected_state, t.direct_message, t.created_at,
      r.termination_reason, r.failure_detail, t.xmin::text AS version
    FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
    WHERE t.id = ${taskId}`);
}

export async function getTaskRowById(db: CommonQueryMethods, taskId: string): Promise<TaskRow | null> {
  if (!isUuid(taskId)) return null;
  return db.maybeOne(sql.type(taskRow)`${TASK_SELECT} WHERE t.id = ${taskId}`);
}


export function openSealed<T>(sealer: Sealer, taskId: string, column: 'status_message' | 'artifacts' | 'history', value: Buffer | null, fallback: T): T {
  if (value === null) return fallback;
  if (sealedHere.has(value)) return sealedHere.get(value) as T;
  const opened = sealer.openJson<T>(taskColumnContext(taskId, column), value);
  if (!opened.ok) throw new Error(`task ${taskId} ${column} cannot be opened (${opened.reason})`);
  return opened.value;
}

export type TaskViewOptions = { historyLength?: number | undefined; includeArtifacts?: boolean };

/** A task row without its sealed content columns: what every reader checks before the content is opened. */
export type TaskHeadRow = Omit<TaskRow, 'status_message' | 'artifacts' | 'history'>;

/** A task row's content, opened; each part read only when a view needs it. */
export type TaskContentReader = { statusMessage: () => Message | null; artifacts: () => Artifact[]; history: () => Message[] };

/** The opened content of a row's sealed columns. */
export type TaskContent = { statusMessage: Message | null; artifacts: Artifact[]; history: Message[] };

export function openTaskContent(sealer: Sealer, row: TaskRow): TaskContent {
  return {
    statusMessage: openSealed<Message | null>(sealer, row.id, 'status_message', row.status_message, null),
    artifacts: openSealed<Artifact[]>(sealer, row.id, 'artifacts', row.artifacts, []),
    history: openSealed<Message[]>(sealer, row.id, 'history', row.history, []),
  };
}

/** The wire Task for a row: content opened, status message derived where the run ended without one. */
export function taskView(sealer: Sealer, row: TaskRow, options: TaskViewOptions = {}): Task {
  return taskViewOf(
    row,
    {
      statusMessage: () => openSealed<Message | null>(sealer, row.id, 'status_message', row.status_message, null),
      artifacts: () => openSealed<Artifact[]>(sealer, row.id, 'artifacts', row.artifacts, []),
      history: () => openSealed<Message[]>(sealer, row.id, 'history', row.history, []),
    },
    options,
  );
}

/** The wire Task for a row's head and its content (opened already, or opened as the view needs it). */
export function taskViewOf(row: TaskHeadRow, content: TaskContentReader, options: TaskViewOptions = {}): Task {
  const state = row.state as TaskState;
  const statusMessage = content.statusMessage();
  let message: Message | undefined = statusMessage ?? undefined;
  const reason = row.termination_reason as TerminationReason | null;
  if (!message && reason && state !== 'TASK_STATE_COMPLETED') {
    message = failureStatusMessage({ id: row.id, contextId: row.context_id }, `${row.id}-status`, reason, row.failure_detail);
  }
  const metadata = { ...row.metadata, ...failureMetadata(reason) };
  const task: Task = {
    id: row.id,
    contextId: row.context_id,
    status: { state, ...(message ? { message } : {}), timestamp: isoTime(row.status_timestamp) },
  };
  if (options.includeArtifacts !== false) {
    const artifacts = content.artifacts();
    if (artifacts.length > 0) task.artifacts = artifacts;
  }
  if (options.historyLength !== 0) {
    const history = content.history();
    const shown = options.historyLength === undefined ? history : history.slice(-options.historyLength);
    if (shown.length > 0) task.history = shown;
  }
  if (Object.keys(metadata).length > 0) task.metadata = metadata;
  return task;
}

const conversationRow = z.object({ context_id: z.string(), history: z.instanceof(Buffer).nullable() });

/**
 * One write of the task's conversation: `messages` join the history as it is under the task-row
 * lock (taken here; the caller holds the run-row lock, taken first) and the status message becomes
 * `status`. Both are sealed at `level`, the answer level the caller read under its lock. History is
 * never rewritten from a copy read earlier: a write that raced a completion would erase its answer.
 */
async function writeConversation(db: CommonQueryMethods, sealer: Sealer, taskId: string, level: PrivacyLevel, status: Message | null, messages: Message[]): Promise<WrittenConversation | null> {
  const row = await db.maybeOne(sql.type(conversationRow)`SELECT context_id, history FROM a2a_tasks WHERE id = ${taskId} FOR UPDATE`);
  if (!row) return null;
  const withContext = (message: Message): Message => ({ ...message, contextId: message.contextId ?? row.context_id });
  const history = sealHistory(sealer, taskId, level, [...openSealed<Message[]>(sealer, taskId, 'history', row.history, []), ...messages.map(withContext)]);
  const shown = status ? keepAtLevel(level, withContext(status)) : undefined;
  const sealedStatus = shown === undefined ? null : sealer.sealJson(taskColumnContext(taskId, 'status_message'), shown);
  await db.query(sql.unsafe`
    UPDATE a2a_tasks SET
      history = ${history === null ? null : sql.binary(history)},
      status_message = ${sealedStatus === null ? null : sql.binary(sealedStatus)},
      updated_at = now()
    WHERE id = ${taskId}`);
  return { statusMessage: shown ?? null, sealed: { statusMessage: sealedStatus, history } };
}

/** What a write of the conversation stored: the status message as kept at the level, and the sealed columns. */
export type WrittenConversation = { statusMessage: Message | null; sealed: { statusMessage: Buffer | null; history: Buffer | null } };

/**
 * The agent's interim status message (the INPUT_REQUIRED prompt), written with the suspension: it
 * is the task's status message while the task waits, and it joins the history, where it stays
 * (docs/decisions/0012-interim-status-messages-in-history.md).
 */
export async function recordAgentStatusMessage(db: CommonQueryMethods, sealer: Sealer, taskId: string, level: PrivacyLevel, message: Message): Promise<WrittenConversation | null> {
  return writeConversation(db, sealer, taskId, level, message, [message]);
}

/**
 * The task moved on without the reply its status message asked for (a statechart agent's deadline
 * ran out): the prompt stops being its status message; it stays in the history.
 */
export async function clearStatusMessage(db: CommonQueryMethods, taskId: string): Promise<void> {
  await db.query(sql.unsafe`UPDATE a2a_tasks SET status_message = NULL, updated_at = now() WHERE id = ${taskId} AND status_message IS NOT NULL`);
}

/**
 * Marks the task as watched by a stream, before the stream reads the journal
 * (docs/decisions/0047-a-fast-run-ends-without-notify-unless-watched.md): a fast run's end,
 * which locks the task row, then NOTIFYs it; an end that took the lock first is committed before
 * this returns, and the stream's read finds it. Commits on its own; a no-op once set, or for a
 * task the caller does not own.
 */
export async function markTaskWatched(db: CommonQueryMethods, owner: string, taskId: string): Promise<void> {
  if (!isUuid(taskId)) return;
  await db.query(sql.unsafe`UPDATE a2a_tasks SET watched = true WHERE id = ${taskId} AND owner = ${owner} AND NOT watched`);
}

/**
 * The client's reply to a waiting task, written in the transaction that hands the run over: it
 * joins the history and the prompt it answers stops being the status message, before any worker
 * can take the run (so a completion always comes after, and is never overwritten).
 */
export async function recordClientReply(db: CommonQueryMethods, sealer: Sealer, taskId: string, level: PrivacyLevel, reply: Message): Promise<void> {
  await writeConversation(db, sealer, taskId, level, null, [reply]);
}

export type TaskResult = { artifacts: Artifact[]; statusMessage: Message | null; directMessage: boolean };

/**
 * The result as the task row now stores it: the content kept at the level (what a reader opens)
 * and the sealed columns, so the completion journals and answers with exactly what it wrote.
 */
export type StoredTaskResult = {
  artifacts: Artifact[];
  statusMessage: Message | null;
  sealed: { artifacts: Buffer | null; statusMessage: Buffer | null; history: Buffer | null };
};

/**
 * The result as the task row will store it, sealed at the level, without writing it: the content
 * kept at the level, the sealed columns, and whether the history changes (the agent's final status
 * message joins it; without one it is unchanged).
 */
export function prepareTaskResult(
  sealer: Sealer,
  taskId: string,
  level: PrivacyLevel,
  result: TaskResult,
  sealedHistory: Buffer | null,
): StoredTaskResult & { historyChanged: boolean } {
  const artifacts = keepAtLevel(level, result.artifacts);
  const status = result.statusMessage ? keepAtLevel(level, result.statusMessage) : undefined;
  const newHistory = result.statusMessage
    ? sealHistory(sealer, taskId, level, [...openSealed<Message[]>(sealer, taskId, 'history', sealedHistory, []), result.statusMessage])
    : null;
  const sealedArtifacts = artifacts === undefined ? null : sealTaskColumn(sealer, taskId, 'artifacts', artifacts);
  const sealedStatus = status === undefined ? null : sealTaskColumn(sealer, taskId, 'status_message', status);
  return {
    artifacts: artifacts ?? [],
    statusMessage: status ?? null,
    sealed: { artifacts: sealedArtifacts, statusMessage: sealedStatus, history: newHistory ?? sealedHistory },
    historyChanged: newHistory !== null,
  };
}

/** A completion's result for writeTaskResultsStatement: the result as prepared, and the journal's watermark after its end. */
export type CompletedTaskResult = {
  taskId: string;
  stored: ReturnType<typeof prepareTaskResult>;
  directMessage: boolean;
  answerLevel: string;
  /** The run revision and last sequence the completion journals up to. */
  revision: number;
  lastSequence: number;
  /** The status time the writer chose for the run's settle (settleRow's `at`); without it, the transaction's. */
  at?: number;
};

/** A completion's result as a row for writeTaskResultsStatement. */
export function taskResultRow({ taskId, stored, directMessage, answerLevel, revision, lastSequence, at }: CompletedTaskResult) {
  return TASK_RESULT_ROW.row({
    id: taskId,
    artifacts: stored.sealed.artifacts,
    status_message: stored.sealed.statusMessage,
    history_changed: stored.historyChanged,
    history: stored.historyChanged ? stored.sealed.history : null,
    direct_message: directMessage,
    answer_level: answerLevel,
    revision,
    last_sequence: lastSequence,
    at: at ?? null,
  });
}

/** A completion's result row, as writeTaskResultsStatement's unnest names and types it (row-shape.ts). */
const TASK_RESULT_ROW = rowShape([
  ['id', 'uuid'],
  ['artifacts', 'bytea'],
  ['status_message', 'bytea'],
  ['history_changed', 'bool'],
  ['history', 'bytea'],
  ['direct_message', 'bool'],
  ['answer_level', 'text'],
  ['revision', 'int8'],
  ['last_sequence', 'int4'],
  ['at', 'float8'],
]);

/** How many cells a taskResultRow has. */
export const TASK_RESULT_COLUMNS = TASK_RESULT_ROW.width;

/**
 * The results of completions as one UPDATE for a CTE of the caller's statement (group commit):
 * each task's sealed result, history when it changed, level and journal watermark, COMPLETED.
 * With `onlyTasksOf`, only the tasks that CTE of the same statement names (`task_id`).
 *
 * It writes the task's state and status time too, the ones the same statement's settle gives the
 * run (the writer's `at`, or the transaction's time as the runs trigger stamps it): one version of
 * the task row instead of two, since the runs trigger then finds the task already COMPLETED and
 * leaves it alone (decision 0036). The caller settles every one of these runs in the same
 * statement or fails it. The move is counted by the row trigger that counts a state written
 * directly (sql/0016), one delta row per task.
 */
export function writeTaskResultsStatement(rows: readonly ShapedRow[], onlyTasksOf: IdentifierSqlToken | null = null) {
  return sql.fragment`
    UPDATE a2a_tasks t SET artifacts = v.artifacts, status_message = v.status_message,
      history = CASE WHEN v.history_changed THEN v.history ELSE t.history END,
      direct_message = v.direct_message, answer_level = v.answer_level,
      projected_revision = v.revision, last_sequence = v.last_sequence, projected_state = 'TASK_STATE_COMPLETED',
      state = 'TASK_STATE_COMPLETED', status_timestamp = coalesce(to_timestamp(v.at / 1000.0), now()), updated_at = now()
    FROM ${TASK_RESULT_ROW.unnest(rows, 'v')}
    WHERE t.id = v.id ${onlyTasksOf === null ? sql.fragment`` : sql.fragment`AND t.id IN (SELECT task_id FROM ${onlyTasksOf})`}`;
}

/** Removes every stored content of the task (a ceiling tightened to metadata or none mid-run). */
export async function scrubTaskContent(db: CommonQueryMethods, taskId: string): Promise<void> {
  await db.query(sql.unsafe`UPDATE a2a_tasks SET artifacts = NULL, status_message = NULL, history = NULL, updated_at = now() WHERE id = ${taskId}`);
}

export type ListFilter = {
  owner: string;
  agent: string;
  contextId?: string | undefined;
  state?: TaskState | undefined;
  statusAfter?: number | undefined;
  pageSize: number;
  after?: { timestamp: number; id: string } | undefined;
};

/** One page, newest status first; keyset on (status_timestamp, id) so equal timestamps never repeat or skip. */
export async function listTaskRows(db: CommonQueryMethods, filter: ListFilter): Promise<{ rows: readonly TaskRow[]; total: number }> {
  const conditions = [sql.fragment`t.owner = ${filter.owner}`, sql.fragment`t.agent = ${filter.agent}`];
  if (filter.contextId !== undefined) conditions.push(sql.fragment`t.context_id = ${filter.contextId}`);
  if (filter.state !== undefined) conditions.push(sql.fragment`t.state = ${filter.state}`);
  if (filter.statusAfter !== undefined) conditions.push(sql.fragment`t.status_timestamp >= ${sql.timestamp(new Date(filter.statusAfter))}`);
  const where = sql.join(conditions, sql.fragment` AND `);
  const keyset = filter.after
    ? sql.fragment`AND (t.status_timestamp, t.id) < (${sql.timestamp(new Date(filter.after.timestamp))}, ${filter.after.id})`
    : sql.fragment``;
  const [rows, total] = await Promise.all([
    db.any(sql.type(taskRow)`${TASK_SELECT} WHERE ${where} ${keyset} ORDER BY t.status_timestamp DESC, t.id DESC LIMIT ${filter.pageSize + 1}`),
    // Without a context or time filter the total comes from the counters and costs the same at any
    // table size; a context is counted (its index bounds the work); a time filter counts its window.
    filter.contextId === undefined && filter.statusAfter === undefined
      ? countTasks(db, { owner: filter.owner, agent: filter.agent, state: filter.state })
      : db.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM a2a_tasks t WHERE ${where}`),
  ]);
  return { rows, total };
}

/** Earlier turns of a context, as model input: the client's messages and the agent's results. */
export async function contextTranscript(db: CommonQueryMethods, sealer: Sealer, owner: string, contextId: string): Promise<Array<{ role: 'user' | 'assistant'; content: string }>> {
  const rows = await db.any(sql.type(taskRow)`${TASK_SELECT} WHERE t.owner = ${owner} AND t.context_id = ${contextId} ORDER BY t.created_at, t.id`);
  const transcript: Array<{ role: 'user' | 'assistant'; content: string }> = [];
  for (const row of rows) {
    const history = openSealed<Message[]>(sealer, row.id, 'history', row.history, []);
    for (const message of history) {
      const text = message.parts.map((part) => part.text ?? (part.data !== undefined ? JSON.stringify(part.data) : '')).filter(Boolean).join('\n');
      if (text) transcript.push({ role: message.role === 'ROLE_USER' ? 'user' : 'assistant', content: text });
    }
    const artifacts = openSealed<Artifact[]>(sealer, row.id, 'artifacts', row.artifacts, []);
    const answer = artifacts.flatMap((artifact) => artifact.parts.map((part) => part.text ?? '')).filter(Boolean).join('\n');
    if (answer) transcript.push({ role: 'assistant', content: answer });
  }
  return transcript;
}

/** The task's stored content rewritten down to `level` (history and status message; artifacts are written at completion). */
export async function tightenTaskContent(db: CommonQueryMethods, sealer: Sealer, taskId: string, level: PrivacyLevel): Promise<void> {
  const row = await db.maybeOne(sql.type(z.object({ history: z.instanceof(Buffer).nullable(), status_message: z.instanceof(Buffer).nullable() }))`
    SELECT history, status_message FROM a2a_tasks WHERE id = ${taskId} FOR UPDATE`);
  if (!row) return;
  const history = keepAtLevel(level, openSealed<Message[]>(sealer, taskId, 'history', row.history, []));
  const status = keepAtLevel(level, openSealed<Message | null>(sealer, taskId, 'status_message', row.status_message, null));
  await db.query(sql.unsafe`
    UPDATE a2a_tasks SET
      history = ${history === undefined || history.length === 0 ? null : sql.binary(sealer.sealJson(taskColumnContext(taskId, 'history'), history))},
      status_message = ${status === undefined || status === null ? null : sql.binary(sealer.sealJson(taskColumnContext(taskId, 'status_message'), status))},
      answer_level = ${level}, updated_at = now()
    WHERE id = ${taskId}`);
}
