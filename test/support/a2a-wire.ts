import { sql, type DatabasePool } from 'slonik';
import { z } from 'zod';
import { expect } from 'vitest';

// Raw A2A requests on both bindings (for what the SDK cannot or will not send), the assertions on
// error shapes of a2a-v1.md, and database checks: row counts and "nothing half-written".

export type Binding = 'JSONRPC' | 'HTTP+JSON';
export const BINDINGS: readonly Binding[] = ['JSONRPC', 'HTTP+JSON'];

export const ERROR_INFO_TYPE = 'type.googleapis.com/google.rpc.ErrorInfo';
export const BAD_REQUEST_TYPE = 'type.googleapis.com/google.rpc.BadRequest';
export const ERROR_DOMAIN = 'a2a-protocol.org';

/** A parsed JSON body, read by tests field by field. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Json = any;

export type WireResponse = {
  status: number;
  headers: Headers;
  text: string;
  /** The parsed body, or undefined when it is not JSON (e.g. an SSE stream). */
  body: Json;
};

export type RequestOptions = {
  token?: string | null;
  /** Extra headers; a value of null removes a default (e.g. `a2a-version`). */
  headers?: Record<string, string | null>;
  /** Overrides the JSON-RPC id (default 1). */
  id?: unknown;
};

function buildHeaders(token: string | null | undefined, contentType: string | null, extra: Record<string, string | null> = {}): Headers {
  const defaults: Record<string, string | null> = {
    'a2a-version': '1.0',
    ...(contentType ? { 'content-type': contentType } : {}),
    ...(token ? { authorization: `Bearer ${token}` } : {}),
  };
  const merged = { ...defaults, ...Object.fromEntries(Object.entries(extra).map(([key, value]) => [key.toLowerCase(), value])) };
  const headers = new Headers();
  for (const [key, value] of Object.entries(merged)) if (value !== null) headers.set(key, value);
  return headers;
}

async function read(response: Response): Promise<WireResponse> {
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: response.status, headers: response.headers, text, body };
}

/** A raw POST to an agent's JSON-RPC endpoint; `body` is sent as is when a string or Buffer. */
export async function rawRpc(baseUrl: string, agent: string, body: unknown, options: RequestOptions = {}): Promise<WireResponse> {
  const payload = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
  const response = await fetch(`${baseUrl}/a2a/${agent}`, {
    method: 'POST',
    headers: buildHeaders(options.token, 'application/json', options.headers),
    body: payload,
  });
  return read(response);
}

/** A raw HTTP+JSON request under /a2a/<agent>; `body` is sent as is when a string or Buffer. */
export async function rawRest(baseUrl: string, agent: string, method: string, path: string, body?: unknown, options: RequestOptions = {}): Promise<WireResponse> {
  const payload = body === undefined ? undefined : typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
  const response = await fetch(`${baseUrl}/a2a/${agent}${path}`, {
    method,
    headers: buildHeaders(options.token, payload === undefined ? null : 'application/a2a+json', options.headers),
    ...(payload === undefined ? {} : { body: payload }),
  });
  return read(response);
}

const query = (params: Record<string, unknown>, skip: readonly string[]) => {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (skip.includes(key) || value === undefined) continue;
    search.set(key, typeof value === 'string' ? value : JSON.stringify(value));
  }
  const text = search.toString();
  return text ? `?${text}` : '';
};
/** A path segment; text that is not well-formed (a lone surrogate) goes as the bytes Node would send. */
const segment = (value: unknown) => {
  try {
    return encodeURIComponent(String(value));
  } catch {
    return [...Buffer.from(String(value), 'utf8')].map((byte) => `%${byte.toString(16).padStart(2, '0')}`).join('');
  }
};

/**
 * One A2A method call on either binding, mapped to the specification's REST paths for HTTP+JSON
 * (a2a-v1.md, "Methods"). Query parameters are sent as their JSON text when not strings.
 */
export async function callA2A(baseUrl: string, agent: string, binding: Binding, method: string, params: Record<string, unknown>, options: RequestOptions = {}): Promise<WireResponse> {
  if (binding === 'JSONRPC') return rawRpc(baseUrl, agent, { jsonrpc: '2.0', id: options.id ?? 1, method, params }, options);
  const { taskId, id, ...rest } = params;
  switch (method) {
    case 'SendMessage':
      return rawRest(baseUrl, agent, 'POST', '/message:send', params, options);
    case 'SendStreamingMessage':
      return rawRest(baseUrl, agent, 'POST', '/message:stream', params, options);
    case 'GetTask':
      return rawRest(baseUrl, agent, 'GET', `/tasks/${segment(id)}${query(params, ['id'])}`, undefined, options);
    case 'ListTasks':
      return rawRest(baseUrl, agent, 'GET', `/tasks${query(params, [])}`, undefined, options);
    case 'CancelTask':
      return rawRest(baseUrl, agent, 'POST', `/tasks/${segment(id)}:cancel`, { ...params }, options);
    case 'SubscribeToTask':
      return rawRest(baseUrl, agent, 'POST', `/tasks/${segment(id)}:subscribe`, { ...params }, options);
    case 'CreateTaskPushNotificationConfig':
      return rawRest(baseUrl, agent, 'POST', `/tasks/${segment(taskId)}/pushNotificationConfigs`, { ...(id === undefined ? {} : { id }), ...rest }, options);
    case 'GetTaskPushNotificationConfig':
      return rawRest(baseUrl, agent, 'GET', `/tasks/${segment(taskId)}/pushNotificationConfigs/${segment(id)}`, undefined, options);
    case 'ListTaskPushNotificationConfigs':
      return rawRest(baseUrl, agent, 'GET', `/tasks/${segment(taskId)}/pushNotificationConfigs${query(rest, [])}`, undefined, options);
    case 'DeleteTaskPushNotificationConfig':
      return rawRest(baseUrl, agent, 'DELETE', `/tasks/${segment(taskId)}/pushNotificationConfigs/${segment(id)}`, undefined, options);
    case 'GetExtendedAgentCard':
      return rawRest(baseUrl, agent, 'GET', '/extendedAgentCard', undefined, options);
    default:
      throw new Error(`no REST mapping for ${method}`);
  }
}

/** The ErrorInfo of a details array, checked for its type and domain. */
function errorInfo(details: unknown): Record<string, unknown> {
  expect(Array.isArray(details), `details/data is an array: ${JSON.stringify(details)}`).toBe(true);
  const info = (details as Array<Record<string, unknown>>).find((detail) => detail['@type'] === ERROR_INFO_TYPE);
  expect(info, `an ErrorInfo in ${JSON.stringify(details)}`).toBeDefined();
  expect(info!.domain).toBe(ERROR_DOMAIN);
  return info!;
}

export type ExpectedError = {
  code: number;
  reason: string;
  /** REST HTTP status. */
  httpStatus: number;
  /** google.rpc.Code name in the REST body. */
  status?: string;
  /** JSON-RPC HTTP status (200 unless the request never reached the method, e.g. 401). */
  rpcHttpStatus?: number;
};

/** Asserts a JSON-RPC error response: HTTP status, envelope, code, ErrorInfo reason and domain. */
export function expectRpcError(response: WireResponse, expected: Pick<ExpectedError, 'code' | 'reason' | 'rpcHttpStatus'>, id: unknown = 1): Record<string, unknown> {
  const context = `${response.status} ${response.text}`;
  expect(response.status, context).toBe(expected.rpcHttpStatus ?? 200);
  expect(response.headers.get('content-type') ?? '', context).toMatch(/^application\/json/);
  expect(response.body, context).toMatchObject({ jsonrpc: '2.0', id, error: { code: expected.code } });
  expect(response.body.result, context).toBeUndefined();
  expect(typeof response.body.error.message, context).toBe('string');
  const info = errorInfo(response.body.error.data);
  expect(info.reason, context).toBe(expected.reason);
  return response.body.error;
}

/** Asserts a REST error: HTTP status, `{error: {code, status, message, details}}` and its ErrorInfo. */
export function expectRestError(response: WireResponse, expected: Pick<ExpectedError, 'reason' | 'httpStatus' | 'status'>): Record<string, unknown> {
  const context = `${response.status} ${response.text}`;
  expect(response.status, context).toBe(expected.httpStatus);
  // Specification 11.1: HTTP+JSON responses, errors included, are application/json.
  expect(response.headers.get('content-type') ?? '', context).toMatch(/^application\/json/);
  expect(Object.keys(response.body ?? {}), context).toEqual(['error']);
  const { error } = response.body;
  expect(error.code, context).toBe(expected.httpStatus);
  expect(typeof error.status, context).toBe('string');
  if (expected.status) expect(error.status, context).toBe(expected.status);
  expect(typeof error.message, context).toBe('string');
  const info = errorInfo(error.details);
  expect(info.reason, context).toBe(expected.reason);
  return error;
}

/** Asserts the error on whichever binding answered. */
export function expectA2AError(binding: Binding, response: WireResponse, expected: ExpectedError, id: unknown = 1): Record<string, unknown> {
  return binding === 'JSONRPC' ? expectRpcError(response, expected, id) : expectRestError(response, expected);
}

/** The successful result on either binding (JSON-RPC `result`, REST body). */
export function expectA2AResult(binding: Binding, response: WireResponse): Json {
  const context = `${response.status} ${response.text}`;
  expect(response.status, context).toBe(200);
  expect(response.headers.get('content-type') ?? '', context).toMatch(/^application\/json/);
  if (binding === 'JSONRPC') {
    expect(response.body?.error, context).toBeUndefined();
    expect(response.body?.result, context).toBeDefined();
    return response.body.result;
  }
  expect(response.body?.error, context).toBeUndefined();
  return response.body;
}

export type RowCounts = { runs: number; a2a_tasks: number; contexts: number; push_configs: number };

/**
 * The rows a request writes. (The journal, a2a_events, is left out: the projector appends to it
 * in the background for runs still going, so its count moves without any request.)
 */
export async function rowCounts(pool: DatabasePool): Promise<RowCounts> {
  return pool.one(sql.type(z.object({ runs: z.number(), a2a_tasks: z.number(), contexts: z.number(), push_configs: z.number() }))`
    SELECT (SELECT count(*)::int FROM runs) AS runs,
      (SELECT count(*)::int FROM a2a_tasks) AS a2a_tasks,
      (SELECT count(*)::int FROM contexts) AS contexts,
      (SELECT count(*)::int FROM push_configs) AS push_configs`);
}

/**
 * Rows that are half-written: a task without its run, a run of a task without the task, a task
 * whose state is not its run's, a task whose context row is missing, a run without a status.
 * Returns a description of each problem (none is the expectation).
 */
export async function halfWrittenRows(pool: DatabasePool): Promise<string[]> {
  const rows = await pool.any(sql.type(z.object({ problem: z.string() }))`
    SELECT 'task ' || t.id || ' has no run' AS problem FROM a2a_tasks t LEFT JOIN runs r ON r.id = t.run_id WHERE r.id IS NULL
    UNION ALL
    SELECT 'run ' || r.id || ' names task ' || r.task_id || ' that does not exist' FROM runs r LEFT JOIN a2a_tasks t ON t.id = r.task_id
      WHERE r.task_id IS NOT NULL AND t.id IS NULL
    UNION ALL
    SELECT 'task ' || t.id || ' is ' || t.state || ' but its run is ' || r.status FROM a2a_tasks t JOIN runs r ON r.id = t.run_id
      WHERE t.state <> keel_task_state(r.status, r.failure_detail)
    UNION ALL
    SELECT 'task ' || t.id || ' is in context ' || t.context_id || ' that its owner has no row for' FROM a2a_tasks t
      LEFT JOIN contexts c ON c.owner = t.owner AND c.id = t.context_id WHERE c.id IS NULL
    UNION ALL
    SELECT 'run ' || r.id || ' has no status' FROM runs r WHERE r.status IS NULL
    UNION ALL
    SELECT 'run ' || r.id || ' is ' || r.status || ' without a termination reason' FROM runs r
      WHERE r.status IN ('completed', 'failed', 'cancelled') AND r.termination_reason IS NULL`);
  return rows.map((row) => row.problem);
}
