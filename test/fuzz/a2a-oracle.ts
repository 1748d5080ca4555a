import { sql, type DatabasePool } from 'slonik';
import { expect } from 'vitest';
import { z } from 'zod';
import { halfWrittenRows } from '../support/a2a-wire.js';
import type { HeaderFacts, Method } from './a2a-arbitraries.js';
import { BODY_LIMIT, type RawResponse } from './fuzz-support.js';

// What a well-formed answer is (a2a-v1.md): a JSON-RPC error or result, a REST error body with a
// 4xx status or a result; the results' shapes; and, after a run, that the rows in the database are
// whole and are exactly the ones the successful answers account for.

export const ERROR_INFO = 'type.googleapis.com/google.rpc.ErrorInfo';

/** The ErrorInfo reasons each JSON-RPC code may carry (a2a-v1.md "Errors"; -32603 and -32006 are never an answer to bad input). */
export const RPC_REASONS: Record<number, readonly string[]> = {
  [-32700]: ['PARSE_ERROR'],
  [-32600]: ['INVALID_REQUEST', 'UNAUTHENTICATED', 'PAYLOAD_TOO_LARGE'],
  [-32601]: ['METHOD_NOT_FOUND'],
  [-32602]: ['INVALID_ARGUMENT'],
  [-32001]: ['TASK_NOT_FOUND'],
  [-32002]: ['TASK_NOT_CANCELABLE'],
  [-32003]: ['PUSH_NOTIFICATION_NOT_SUPPORTED'],
  [-32004]: ['UNSUPPORTED_OPERATION', 'RESULT_NOT_RETAINABLE'],
  [-32005]: ['CONTENT_TYPE_NOT_SUPPORTED'],
  [-32007]: ['EXTENDED_AGENT_CARD_NOT_CONFIGURED'],
  [-32008]: ['EXTENSION_SUPPORT_REQUIRED'],
  [-32009]: ['VERSION_NOT_SUPPORTED'],
};

/** The reasons each REST status may carry. */
export const REST_REASONS: Record<number, readonly string[]> = {
  400: [
    'PARSE_ERROR',
    'INVALID_REQUEST',
    'INVALID_ARGUMENT',
    'PUSH_NOTIFICATION_NOT_SUPPORTED',
    'UNSUPPORTED_OPERATION',
    'RESULT_NOT_RETAINABLE',
    'EXTENDED_AGENT_CARD_NOT_CONFIGURED',
    'EXTENSION_SUPPORT_REQUIRED',
    'VERSION_NOT_SUPPORTED',
  ],
  401: ['UNAUTHENTICATED'],
  404: ['TASK_NOT_FOUND', 'METHOD_NOT_FOUND'],
  405: ['METHOD_NOT_FOUND'],
  409: ['TASK_NOT_CANCELABLE'],
  413: ['PAYLOAD_TOO_LARGE'],
  415: ['CONTENT_TYPE_NOT_SUPPORTED'],
};
const GRPC_STATUSES = ['INVALID_ARGUMENT', 'NOT_FOUND', 'FAILED_PRECONDITION', 'UNAUTHENTICATED', 'UNIMPLEMENTED', 'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED'];

// ---- result shapes ----

const timestamp = z.string().regex(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/, 'ISO 8601 UTC with milliseconds');
const record = z.record(z.unknown());
const part = z
  .object({ text: z.string().optional(), raw: z.string().optional(), url: z.string().optional(), data: z.unknown().optional(), mediaType: z.string().optional(), filename: z.string().optional(), metadata: record.optional() })
  .strict()
  .refine((value) => ['text', 'raw', 'url', 'data'].filter((key) => (value as Record<string, unknown>)[key] !== undefined).length === 1, 'exactly one of text, raw, url, data');
const message = z
  .object({
    messageId: z.string().min(1),
    role: z.enum(['ROLE_USER', 'ROLE_AGENT']),
    parts: z.array(part),
    contextId: z.string().optional(),
    taskId: z.string().optional(),
    referenceTaskIds: z.array(z.string()).optional(),
    metadata: record.optional(),
    extensions: z.array(z.string()).optional(),
  })
  .strict();
const TASK_STATES = [
  'TASK_STATE_SUBMITTED',
  'TASK_STATE_WORKING',
  'TASK_STATE_INPUT_REQUIRED',
  'TASK_STATE_AUTH_REQUIRED',
  'TASK_STATE_COMPLETED',
  'TASK_STATE_FAILED',
  'TASK_STATE_CANCELED',
  'TASK_STATE_REJECTED',
] as const;
const status = z.object({ state: z.enum(TASK_STATES), message: message.optional(), timestamp }).strict();
const artifact = z.object({ artifactId: z.string().min(1), name: z.string().optional(), description: z.string().optional(), parts: z.array(part).min(1), metadata: record.optional() }).strict();
export const taskSchema = z
  .object({ id: z.string().uuid(), contextId: z.string().min(1), status, artifacts: z.array(artifact).optional(), history: z.array(message).optional(), metadata: record.optional() })
  .strict();
const sendResult = z.union([z.object({ task: taskSchema }).strict(), z.object({ message }).strict()]);
const listResult = z.object({ tasks: z.array(taskSchema), nextPageToken: z.string(), pageSize: z.number().int().min(1).max(100), totalSize: z.number().int().min(0) }).strict();
const pushConfig = z
  .object({ id: z.string().min(1), taskId: z.string().uuid(), url: z.string().url(), token: z.string().optional(), authentication: z.object({ scheme: z.string(), credentials: z.string().optional() }).strict().optional() })
  .strict();
const card = z
  .object({
    name: z.string(),
    description: z.string(),
    version: z.string(),
    supportedInterfaces: z.array(z.object({ url: z.string(), protocolBinding: z.enum(['JSONRPC', 'HTTP+JSON', 'GRPC']), protocolVersion: z.literal('1.0') }).passthrough()).min(1),
    capabilities: record,
    defaultInputModes: z.array(z.string()),
    defaultOutputModes: z.array(z.string()),
    skills: z.array(z.object({ id: z.string(), name: z.string(), description: z.string(), tags: z.array(z.string()) }).passthrough()),
  })
  .passthrough();
export const streamResponse = z.union([
  z.object({ task: taskSchema }).strict(),
  z.object({ message }).strict(),
  z.object({ statusUpdate: z.object({ taskId: z.string(), contextId: z.string(), status, metadata: record.optional() }).strict() }).strict(),
  z
    .object({ artifactUpdate: z.object({ taskId: z.string(), contextId: z.string(), artifact, append: z.boolean().optional(), lastChunk: z.boolean().optional(), metadata: record.optional() }).strict() })
    .strict(),
]);

const RESULTS: Record<Exclude<Method, 'SendStreamingMessage' | 'SubscribeToTask'>, z.ZodTypeAny> = {
  SendMessage: sendResult,
  GetTask: taskSchema,
  ListTasks: listResult,
  CancelTask: taskSchema,
  CreateTaskPushNotificationConfig: pushConfig,
  GetTaskPushNotificationConfig: pushConfig,
  ListTaskPushNotificationConfigs: z.object({ configs: z.array(pushConfig), nextPageToken: z.string() }).strict(),
  DeleteTaskPushNotificationConfig: z.object({}).strict(),
  GetExtendedAgentCard: card,
};

function expectShape(schema: z.ZodTypeAny, value: unknown, context: string): void {
  const parsed = schema.safeParse(value);
  expect(parsed.success, `${context}\n${parsed.success ? '' : JSON.stringify(parsed.error.issues.slice(0, 5))}`).toBe(true);
}

/** The frames of an SSE body (`data:` lines joined), each parsed as JSON. */
export function sseFrames(text: string): unknown[] {
  return text
    .split('\n\n')
    .map((block) =>
      block
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).trimStart())
        .join('\n'),
    )
    .filter(Boolean)
    .map((data) => JSON.parse(data) as unknown);
}

const STREAM_ENDS = new Set(['TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED', 'TASK_STATE_INPUT_REQUIRED', 'TASK_STATE_AUTH_REQUIRED']);

/** Checks a stream's StreamResponses: a task (or one message) first, then updates of that task, ending at a state that ends streams. */
function expectStream(responses: unknown[], context: string): { taskId: string; contextId: string } | null {
  expect(responses.length, context).toBeGreaterThan(0);
  for (const response of responses) expectShape(streamResponse, response, context);
  const first = responses[0] as { task?: { id: string; contextId: string }; message?: unknown };
  if (first.message) {
    expect(responses.length, context).toBe(1);
    return null;
  }
  const task = first.task!;
  for (const response of responses.slice(1) as Array<{ statusUpdate?: { taskId: string }; artifactUpdate?: { taskId: string }; task?: unknown; message?: unknown }>) {
    const update = response.statusUpdate ?? response.artifactUpdate;
    expect(update?.taskId, context).toBe(task.id);
  }
  const last = responses[responses.length - 1] as { task?: { status: { state: string } }; statusUpdate?: { status: { state: string } } };
  const state = last.statusUpdate?.status.state ?? last.task?.status.state;
  expect(state && STREAM_ENDS.has(state), `stream ends at a terminal or interrupted state: ${context}`).toBe(true);
  return { taskId: task.id, contextId: task.contextId };
}

// ---- the ledger: what the successful answers say was written ----

export class Ledger {
  /** Tasks created, with their context. */
  readonly tasks = new Map<string, string>();
  /** Tasks whose SendMessage carried a push config (which the answer does not show). */
  readonly tasksWithInlinePush = new Set<string>();
  /** Push configs created by CreateTaskPushNotificationConfig, `${taskId}\n${id}`. */
  readonly configs = new Set<string>();
  /** Of those, the ones a successful DeleteTaskPushNotificationConfig removed. */
  readonly deletedConfigs = new Set<string>();

  /** Records what a successful answer of `method` says it created or removed. */
  record(method: Method | null, result: unknown, params: unknown): void {
    if (method === 'SendMessage' || method === 'SendStreamingMessage') {
      const task = (result as { task?: { id: string; contextId: string } }).task;
      if (!task) return;
      this.tasks.set(task.id, task.contextId);
      if (inlinePush(params)) this.tasksWithInlinePush.add(task.id);
    } else if (method === 'CreateTaskPushNotificationConfig') {
      const config = result as { taskId: string; id: string };
      this.configs.add(`${config.taskId}\n${config.id}`);
    } else if (method === 'DeleteTaskPushNotificationConfig') {
      const { taskId, id } = (params ?? {}) as { taskId?: unknown; id?: unknown };
      const key = `${String(taskId)}\n${String(id)}`;
      if (this.configs.has(key)) this.deletedConfigs.add(key);
    }
  }
}

/** Whether SendMessage params carry a push config, by either of its ProtoJSON names. */
function inlinePush(params: unknown): boolean {
  const configuration = (params as Record<string, Record<string, unknown> | undefined> | null)?.configuration;
  return typeof configuration === 'object' && configuration !== null && (configuration.taskPushNotificationConfig !== undefined || configuration.task_push_notification_config !== undefined);
}

// ---- JSON-RPC ----

export type RpcFacts = {
  headers: HeaderFacts;
  /** The body as sent. */
  body: Buffer;
  /** The body as the server reads it (UTF-8, invalid bytes replaced), parsed; undefined when not JSON. */
  parsed: unknown;
};

/**
 * The JSON-RPC id the server can echo: a string or number `id`, otherwise null. A number no double
 * holds (1e999 parses as Infinity) goes back as null, the only JSON for it.
 */
export function readableId(parsed: unknown): string | number | null {
  const id = typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>).id : undefined;
  return typeof id === 'string' || (typeof id === 'number' && Number.isFinite(id)) ? id : null;
}

export function parseAsServer(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString('utf8'));
  } catch {
    return undefined;
  }
}

const rpcMethod = (parsed: unknown): string | undefined => {
  const method = typeof parsed === 'object' && parsed !== null ? (parsed as Record<string, unknown>).method : undefined;
  return typeof method === 'string' ? method : undefined;
};

/**
 * Asserts a JSON-RPC answer: never a 5xx; an error envelope with a known code, its reason and an
 * ErrorInfo, or a result of the method's shape (a stream of them for the streaming methods); and
 * what the headers and size decide (payload too large, unauthenticated, version) comes first.
 * Returns the method and result of a success, for the ledger.
 */
export function expectRpcAnswer(response: RawResponse, facts: RpcFacts, context: string): { method: Method; result: unknown; params: unknown } | null {
  const where = `${context}\n=> ${response.status} ${response.contentType} ${response.text.slice(0, 600)}`;
  expect(response.status, where).toBeLessThan(500);
  const oversized = facts.body.length > BODY_LIMIT;
  const method = rpcMethod(facts.parsed);
  const params = (facts.parsed as Record<string, unknown> | undefined)?.params;
  const expectedId = facts.headers.contentType === 'json' && !oversized ? readableId(facts.parsed) : undefined;

  if (response.contentType.startsWith('text/event-stream')) {
    expect(oversized || !facts.headers.authValid || !facts.headers.versionValid, where).toBe(false);
    expect(['SendStreamingMessage', 'SubscribeToTask'], where).toContain(method);
    expect(response.status, where).toBe(200);
    const frames = sseFrames(response.text) as Array<Record<string, unknown>>;
    for (const frame of frames) {
      expect(Object.keys(frame).sort(), where).toEqual(['id', 'jsonrpc', 'result']);
      expect(frame.jsonrpc, where).toBe('2.0');
      expect(frame.id === readableId(facts.parsed), where).toBe(true);
    }
    const stream = expectStream(
      frames.map((frame) => frame.result),
      where,
    );
    return { method: method as Method, result: stream ? { task: { id: stream.taskId, contextId: stream.contextId } } : {}, params };
  }

  expect(response.contentType, where).toMatch(/^application\/json/);
  const body = response.body as Record<string, unknown>;
  expect(typeof body === 'object' && body !== null && !Array.isArray(body), where).toBe(true);
  expect(body.jsonrpc, where).toBe('2.0');
  expect(['string', 'number'].includes(typeof body.id) || body.id === null, where).toBe(true);
  // (=== compares JSON numbers: -0 is sent back as 0, the same JSON number.)
  if (expectedId !== undefined && body.id !== null) expect(body.id === expectedId, `id ${String(body.id)} for ${String(expectedId)}: ${where}`).toBe(true);

  if ('error' in body) {
    expect(Object.keys(body).sort(), where).toEqual(['error', 'id', 'jsonrpc']);
    const error = body.error as { code: number; message: unknown; data: unknown };
    expect(Object.keys(error).sort(), where).toEqual(['code', 'data', 'message']);
    expect(Object.keys(RPC_REASONS).map(Number), where).toContain(error.code);
    expect(typeof error.message, where).toBe('string');
    expect(Array.isArray(error.data), where).toBe(true);
    const info = (error.data as Array<Record<string, unknown>>).find((detail) => detail['@type'] === ERROR_INFO);
    expect(info, where).toBeDefined();
    expect(info!.domain, where).toBe('a2a-protocol.org');
    expect(RPC_REASONS[error.code], where).toContain(info!.reason);
    expect(response.status, where).toBe(info!.reason === 'UNAUTHENTICATED' ? 401 : 200);

    // What the request's size and headers decide, before anything in the body (a media type
    // Fastify cannot parse is refused before the size is looked at).
    if (oversized) expect(facts.headers.contentType === 'odd' ? ['PAYLOAD_TOO_LARGE', 'INVALID_REQUEST'] : ['PAYLOAD_TOO_LARGE'], where).toContain(info!.reason);
    else expect(info!.reason, where).not.toBe('PAYLOAD_TOO_LARGE');
    if (!oversized && facts.headers.contentType !== 'odd') {
      if (!facts.headers.authValid) expect(info!.reason, where).toBe('UNAUTHENTICATED');
      else if (!facts.headers.versionValid) expect(info!.reason, where).toBe('VERSION_NOT_SUPPORTED');
      else if (facts.headers.contentType === 'other') expect(info!.reason, where).toBe('CONTENT_TYPE_NOT_SUPPORTED');
      else if (facts.parsed === undefined) expect(info!.reason, where).toBe('PARSE_ERROR');
    }
    // The id is the request's whenever the body could be read as an object with one.
    if (expectedId !== undefined && facts.headers.contentType === 'json') expect(body.id === expectedId, `id ${String(body.id)} for ${String(expectedId)}: ${where}`).toBe(true);
    return null;
  }

  expect(Object.keys(body).sort(), where).toEqual(['id', 'jsonrpc', 'result']);
  expect(oversized || !facts.headers.authValid || !facts.headers.versionValid, `a result despite the request's size or headers: ${where}`).toBe(false);
  expect(method !== undefined && method in RESULTS, `a result for a method that is not one: ${where}`).toBe(true);
  expectShape(RESULTS[method as keyof typeof RESULTS], body.result, where);
  return { method: method as Method, result: body.result, params };
}

// ---- REST ----

export type RestFacts = {
  headers: HeaderFacts;
  op: Method | null;
  body: Buffer | undefined;
  /** A path segment's percent-encoding is not UTF-8: Fastify's own 400 may answer. */
  malformedPath: boolean;
};

/**
 * Asserts a REST answer: never a 5xx; `{error: {code, status, message, details}}` with a 4xx status
 * equal to `code` and an ErrorInfo, or the operation's result (or stream).
 */
export function expectRestAnswer(response: RawResponse, facts: RestFacts, context: string): { result: unknown } | null {
  const where = `${context}\n=> ${response.status} ${response.contentType} ${response.text.slice(0, 600)}`;
  expect(response.status, where).toBeLessThan(500);
  const oversized = (facts.body?.length ?? 0) > BODY_LIMIT;

  // Fastify refuses a URL whose percent-encoding is not UTF-8 before routing; Keel answers it in
  // the binding's shape (INVALID_REQUEST, 400), checked with every other error below.
  expect((response.body as { code?: string } | undefined)?.code, `Fastify's own body: ${where}`).not.toBe('FST_ERR_BAD_URL');

  if (response.status >= 400) {
    expect(response.contentType, where).toMatch(/^application\/json/);
    const body = response.body as { error?: Record<string, unknown> };
    expect(Object.keys(body ?? {}), where).toEqual(['error']);
    const error = body.error!;
    expect(Object.keys(error).sort(), where).toEqual(['code', 'details', 'message', 'status']);
    expect(error.code, where).toBe(response.status);
    expect(GRPC_STATUSES, where).toContain(error.status);
    expect(typeof error.message, where).toBe('string');
    expect(Array.isArray(error.details), where).toBe(true);
    const info = (error.details as Array<Record<string, unknown>>).find((detail) => detail['@type'] === ERROR_INFO);
    expect(info, where).toBeDefined();
    expect(info!.domain, where).toBe('a2a-protocol.org');
    expect(REST_REASONS[response.status], where).toContain(info!.reason);

    if (facts.malformedPath && response.status === 400 && info!.reason === 'INVALID_REQUEST') return null;
    if (oversized) expect(facts.headers.contentType === 'odd' ? ['PAYLOAD_TOO_LARGE', 'INVALID_REQUEST'] : ['PAYLOAD_TOO_LARGE'], where).toContain(info!.reason);
    else expect(info!.reason, where).not.toBe('PAYLOAD_TOO_LARGE');
    if (!oversized && !facts.malformedPath && (facts.body === undefined || facts.headers.contentType !== 'odd')) {
      if (!facts.headers.authValid) expect(info!.reason, where).toBe('UNAUTHENTICATED');
      else if (!facts.headers.versionValid) expect(info!.reason, where).toBe('VERSION_NOT_SUPPORTED');
    }
    if (facts.op === null && facts.headers.authValid && facts.headers.versionValid && !oversized) expect(info!.reason, where).not.toBe('TASK_NOT_FOUND');
    return null;
  }

  expect(response.status, where).toBe(200);
  expect(oversized || !facts.headers.authValid || !facts.headers.versionValid, `a result despite the request's size or headers: ${where}`).toBe(false);
  expect(facts.op, `a result from a path or verb no operation has: ${where}`).not.toBeNull();
  if (facts.op === 'SendStreamingMessage' || facts.op === 'SubscribeToTask') {
    expect(response.contentType, where).toMatch(/^text\/event-stream/);
    const stream = expectStream(sseFrames(response.text), where);
    return { result: stream ? { task: { id: stream.taskId, contextId: stream.contextId } } : {} };
  }
  expect(response.contentType, where).toMatch(/^application\/json/);
  expectShape(RESULTS[facts.op!], response.body, where);
  return { result: response.body };
}

// ---- the database after a run ----

const idRow = z.object({ id: z.string() });

/**
 * No row is half-written, and the rows are the ones the successful answers account for: every task
 * and its run, every context, every push config (and nothing else).
 */
export async function expectRowsAccountedFor(pool: DatabasePool, ledger: Ledger, ownerId: string): Promise<void> {
  expect(await halfWrittenRows(pool)).toEqual([]);

  const orphanContexts = await pool.anyFirst(sql.type(idRow)`
    SELECT c.id FROM contexts c LEFT JOIN clients k ON k.id = c.owner WHERE k.id IS NULL
    UNION ALL SELECT c.id FROM contexts c WHERE NOT EXISTS (SELECT 1 FROM a2a_tasks t WHERE t.owner = c.owner AND t.context_id = c.id)`);
  expect(orphanContexts, 'contexts without an owner or without a task').toEqual([]);

  const tasks = await pool.any(sql.type(z.object({ id: z.string(), context_id: z.string(), owner: z.string(), run_id: z.string() }))`SELECT id, context_id, owner, run_id FROM a2a_tasks`);
  expect(tasks.map((task) => task.id).sort(), 'a2a_tasks rows are the tasks the answers returned').toEqual([...ledger.tasks.keys()].sort());
  for (const task of tasks) {
    expect(task.context_id).toBe(ledger.tasks.get(task.id));
    expect(task.owner).toBe(ownerId);
    expect(task.run_id).toBe(task.id);
  }

  const runs = await pool.any(sql.type(z.object({ id: z.string(), task_id: z.string().nullable() }))`SELECT id, task_id FROM runs`);
  expect(runs.length, 'one run per task').toBe(tasks.length);
  for (const run of runs) expect(ledger.tasks.has(run.task_id ?? ''), `run ${run.id} belongs to a task an answer returned`).toBe(true);

  const contexts = await pool.anyFirst(sql.type(idRow)`SELECT id FROM contexts WHERE owner = ${ownerId}`);
  expect([...contexts].sort(), 'contexts are the contexts of the tasks').toEqual([...new Set(ledger.tasks.values())].sort());

  const configs = await pool.any(sql.type(z.object({ task_id: z.string(), id: z.string(), owner: z.string(), deleted: z.boolean() }))`
    SELECT task_id, id, owner, deleted_at IS NOT NULL AS deleted FROM push_configs`);
  const inlinePerTask = new Map<string, number>();
  for (const config of configs) {
    const key = `${config.task_id}\n${config.id}`;
    expect(config.owner).toBe(ownerId);
    expect(ledger.tasks.has(config.task_id), `push config ${JSON.stringify(key)} is on a task an answer returned`).toBe(true);
    if (ledger.configs.has(key)) {
      expect(config.deleted, `push config ${JSON.stringify(key)} deleted exactly when a DeleteTaskPushNotificationConfig said so`).toBe(ledger.deletedConfigs.has(key));
    } else {
      // Created with its task by a SendMessage that carried it: at most one per such task.
      expect(ledger.tasksWithInlinePush.has(config.task_id), `push config ${JSON.stringify(key)} that no answer accounts for`).toBe(true);
      inlinePerTask.set(config.task_id, (inlinePerTask.get(config.task_id) ?? 0) + 1);
    }
  }
  for (const [taskId, count] of inlinePerTask) expect(count, `inline push configs of task ${taskId}`).toBe(1);
  expect([...inlinePerTask.keys()].sort(), 'every SendMessage that carried a push config stored it').toEqual([...ledger.tasksWithInlinePush].sort());
  const stored = new Set(configs.map((config) => `${config.task_id}\n${config.id}`));
  for (const key of ledger.configs) expect(stored.has(key), `push config ${JSON.stringify(key)} that an answer created is stored`).toBe(true);
}
