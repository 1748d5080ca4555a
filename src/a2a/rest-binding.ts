import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { KeelLogger } from '../log/logger.js';
import { createPushConfigParamsSchema, getPushConfigParamsSchema, getTaskParamsSchema, listPushConfigsParamsSchema, listTasksParamsSchema, sendMessageParamsSchema } from '../protocol/wire.js';
import { A2AErrors, invalidParams, restError, type A2AError, type Result } from './a2a-error.js';
import type { A2AService, Caller } from './a2a-service.js';
import {
  A2A_JSON,
  challengeIfUnauthenticated,
  headerValue,
  holdingStreamSlot,
  idempotencyKeyOf,
  JSON_TYPES,
  mediaType,
  pacedBody,
  parseParams,
  responsePieces,
  RESPONSE_JSON,
  retryAfterHeader,
  streamToSse,
  subscriptionOptions,
  type BindingDeps,
} from './binding-support.js';
import { lastEventId } from './sse.js';
import { inA2AServerSpan, noteA2AError } from '../tracing/a2a-server-span.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';

// The HTTP+JSON binding under /a2a/<agent>/: each operation is a path pattern in restOperations
// with a named handler, which checks the HTTP method, reads the path, query or body and calls the
// service.

/** One HTTP+JSON request that passed the gate, with its operation path (still percent-encoded). */
export type RestCall = {
  request: FastifyRequest;
  reply: FastifyReply;
  path: string;
  method: string;
  caller: Caller;
  activated: string[];
  service: A2AService;
  logger: KeelLogger;
};

export type RestOperationHandler = (call: RestCall, match: RegExpExecArray) => Promise<unknown>;

function restFail(reply: FastifyReply, error: A2AError) {
  noteA2AError(error);
  challengeIfUnauthenticated(reply, error);
  retryAfterHeader(reply, error);
  return reply.code(error.httpStatus).type(RESPONSE_JSON).send(restError(error));
}

const restAnswer = (reply: FastifyReply, result: Result<unknown>) => (result.ok ? reply.code(200).type(RESPONSE_JSON).send(result.value) : restFail(reply, result.error));

/** 405 for a method the operation does not take; `hint` names the ones it does. */
const wrongMethod = (call: RestCall, hint = '') => restFail(call.reply, A2AErrors.methodNotFound(`${call.method} ${call.path} is not supported${hint}`, { httpStatus: 405 }));

/**
 * The HTTP+JSON operation path under /a2a/<agent> as the client sent it, still percent-encoded.
 * Fastify's wildcard param is decoded already, so decoding its ids again read "%2541" as "A" and
 * threw on "%25" followed by no hex digits (a 500); it also turned an encoded "/" or ":" in an id
 * into a separator. Matching the raw path and decoding each id once (pathSegment) avoids all three.
 */
export function operationPath(url: string): string {
  const path = url.split('?')[0]!;
  const slash = path.indexOf('/', '/a2a/'.length);
  return slash === -1 ? '/' : path.slice(slash);
}

/** One percent-encoded path segment decoded, or null when its encoding is not valid UTF-8. */
function pathSegment(raw: string): string | null {
  try {
    return decodeURIComponent(raw);
  } catch {
    return null;
  }
}

const badSegment = (field: string) => invalidParams([{ path: [field], message: 'the path segment is not valid percent-encoded UTF-8' }]);

const NUMBER_QUERY = new Set(['pageSize', 'historyLength']);
const BOOLEAN_QUERY = new Set(['includeArtifacts']);

/** The query string as params: numbers and booleans typed, the last of repeated keys, A2A-Version left out. */
function queryParams(request: FastifyRequest): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, raw] of Object.entries((request.query ?? {}) as Record<string, unknown>)) {
    const value = Array.isArray(raw) ? raw[raw.length - 1] : raw;
    if (typeof value !== 'string' || key === 'A2A-Version') continue;
    if (NUMBER_QUERY.has(key)) out[key] = /^-?\d+$/.test(value) ? Number(value) : value;
    else if (BOOLEAN_QUERY.has(key)) out[key] = value === 'true' ? true : value === 'false' ? false : value;
    else out[key] = value;
  }
  return out;
}

function jsonBody(request: FastifyRequest): Result<unknown> {
  const type = mediaType(request);
  if (!JSON_TYPES.has(type)) {
    return { ok: false, error: A2AErrors.contentTypeNotSupported(`content type ${type || '(none)'} is not supported; send ${RESPONSE_JSON} or ${A2A_JSON}`) };
  }
  try {
    return { ok: true, value: JSON.parse(String(request.body ?? '')) };
  } catch (error) {
    return { ok: false, error: A2AErrors.parse(`the body is not valid JSON: ${(error as Error).message}`) };
  }
}

/** The SendMessageParams of a POST body, shared by message:send and message:stream. */
function sendMessageInput(call: RestCall) {
  const raw = jsonBody(call.request);
  return raw.ok ? parseParams(sendMessageParamsSchema, raw.value) : raw;
}

export async function handleSendMessage(call: RestCall) {
  if (call.method !== 'POST') return wrongMethod(call, '; use POST');
  const input = sendMessageInput(call);
  if (!input.ok) return restFail(call.reply, input.error);
  return restAnswer(call.reply, await call.service.sendMessage(call.caller, input.value, idempotencyKeyOf(call.request)));
}

export async function handleSendStreamingMessage(call: RestCall) {
  if (call.method !== 'POST') return wrongMethod(call, '; use POST');
  const { service, caller } = call;
  const input = sendMessageInput(call);
  if (!input.ok) return restFail(call.reply, input.error);
  const accepted = await service.acceptMessage(caller, input.value, undefined, idempotencyKeyOf(call.request));
  if (!accepted.ok) return restFail(call.reply, accepted.error);
  const continuing = input.value.message.taskId !== undefined;
  return streamToSse(
    call.logger,
    call.request,
    call.reply,
    (signal) => service.stream(caller, accepted.value.taskId, { signal, withSnapshot: true, ...(continuing ? { lastEventId: accepted.value.afterSequence } : { fromCreation: true }) }),
    responsePieces,
    call.activated,
    service.streamFlow,
  );
}

export async function handleListTasks(call: RestCall) {
  if (call.method !== 'GET') return wrongMethod(call, '; use GET');
  const input = parseParams(listTasksParamsSchema, queryParams(call.request));
  return input.ok ? restAnswer(call.reply, await call.service.listTasks(call.caller, input.value)) : restFail(call.reply, input.error);
}

export async function handleGetExtendedAgentCard(call: RestCall) {
  if (call.method !== 'GET') return wrongMethod(call, '; use GET');
  return restAnswer(call.reply, await call.service.extendedCard(call.caller));
}

export async function handleCancelTask(call: RestCall, match: RegExpExecArray) {
  if (call.method !== 'POST') return wrongMethod(call, '; use POST');
  const taskId = pathSegment(match[1]!);
  if (taskId === null) return restFail(call.reply, badSegment('id'));
  return restAnswer(call.reply, await call.service.cancelTask(call.caller, taskId));
}

export async function handleSubscribeToTask(call: RestCall, match: RegExpExecArray) {
  if (call.method !== 'POST' && call.method !== 'GET') return wrongMethod(call, '; use POST or GET');
  const { service, caller } = call;
  const taskId = pathSegment(match[1]!);
  if (taskId === null) return restFail(call.reply, badSegment('id'));
  const resumeAfter = lastEventId(call.request);
  const check = await service.checkSubscribable(caller, taskId, resumeAfter);
  if (!check.ok) return restFail(call.reply, check.error);
  return streamToSse(
    call.logger,
    call.request,
    call.reply,
    (signal) => service.stream(caller, taskId, subscriptionOptions(caller, signal, resumeAfter)),
    responsePieces,
    call.activated,
    service.streamFlow,
  );
}

async function createTaskPushConfig(call: RestCall, taskId: string) {
  const raw = jsonBody(call.request);
  if (!raw.ok) return restFail(call.reply, raw.error);
  const input = parseParams(createPushConfigParamsSchema, { ...(typeof raw.value === 'object' && raw.value !== null ? raw.value : {}), taskId });
  return input.ok ? restAnswer(call.reply, await call.service.createPushConfig(call.caller, input.value)) : restFail(call.reply, input.error);
}

async function listTaskPushConfigs(call: RestCall, taskId: string) {
  const input = parseParams(listPushConfigsParamsSchema, { ...queryParams(call.request), taskId });
  return input.ok ? restAnswer(call.reply, await call.service.listPushConfigs(call.caller, taskId, input.value.pageSize, input.value.pageToken)) : restFail(call.reply, input.error);
}

/** POST creates a push notification config of the task, GET lists them. */
export async function handleTaskPushConfigs(call: RestCall, match: RegExpExecArray) {
  const taskId = pathSegment(match[1]!);
  if (taskId === null) return restFail(call.reply, badSegment('taskId'));
  if (call.method === 'POST') return createTaskPushConfig(call, taskId);
  if (call.method === 'GET') return listTaskPushConfigs(call, taskId);
  return wrongMethod(call);
}

/** GET reads one push notification config of the task, DELETE deletes it. */
export async function handleTaskPushConfig(call: RestCall, match: RegExpExecArray) {
  if (call.method !== 'GET' && call.method !== 'DELETE') return wrongMethod(call);
  // Through the params schema like JSON-RPC, so both bindings refuse the same ids.
  const [taskId, id] = [pathSegment(match[1]!), pathSegment(match[2]!)];
  if (taskId === null || id === null) return restFail(call.reply, badSegment(taskId === null ? 'taskId' : 'id'));
  const input = parseParams(getPushConfigParamsSchema, { taskId, id });
  if (!input.ok) return restFail(call.reply, input.error);
  const { service, caller } = call;
  const { value } = input;
  return restAnswer(call.reply, call.method === 'GET' ? await service.getPushConfig(caller, value.taskId, value.id) : await service.deletePushConfig(caller, value.taskId, value.id));
}

export async function handleGetTask(call: RestCall, match: RegExpExecArray) {
  if (call.method !== 'GET') return wrongMethod(call, '; use GET');
  const id = pathSegment(match[1]!);
  if (id === null) return restFail(call.reply, badSegment('id'));
  const input = parseParams(getTaskParamsSchema, { ...queryParams(call.request), id });
  if (!input.ok) return restFail(call.reply, input.error);
  // The revision's JSON as its concurrent readers share it (encoded once, sent as it is).
  const shared = await call.service.getSharedTask(call.caller, input.value.id, input.value.historyLength);
  return shared.ok ? pacedBody(call.reply.code(200).type(RESPONSE_JSON), call.service.streamFlow, [shared.value.json]) : restFail(call.reply, shared.error);
}

/**
 * The operations by path under /a2a/<agent>, tried in order; the first whose pattern matches handles
 * the request. A streaming one holds one of the client's open-stream slots while it runs.
 */
export const restOperations: ReadonlyArray<{ pattern: RegExp; handle: RestOperationHandler; streaming?: true; method: (httpMethod: string) => string }> = [
  { pattern: /^\/message:send$/, handle: handleSendMessage, method: () => 'SendMessage' },
  { pattern: /^\/message:stream$/, handle: handleSendStreamingMessage, streaming: true, method: () => 'SendStreamingMessage' },
  { pattern: /^\/tasks$/, handle: handleListTasks, method: () => 'ListTasks' },
  { pattern: /^\/extendedAgentCard$/, handle: handleGetExtendedAgentCard, method: () => 'GetExtendedAgentCard' },
  { pattern: /^\/tasks\/([^/:]+):cancel$/, handle: handleCancelTask, method: () => 'CancelTask' },
  { pattern: /^\/tasks\/([^/:]+):subscribe$/, handle: handleSubscribeToTask, streaming: true, method: () => 'SubscribeToTask' },
  {
    pattern: /^\/tasks\/([^/:]+)\/pushNotificationConfigs$/,
    handle: handleTaskPushConfigs,
    method: (httpMethod) => (httpMethod === 'GET' ? 'ListTaskPushNotificationConfigs' : 'CreateTaskPushNotificationConfig'),
  },
  {
    pattern: /^\/tasks\/([^/:]+)\/pushNotificationConfigs\/([^/]+)$/,
    handle: handleTaskPushConfig,
    method: (httpMethod) => (httpMethod === 'DELETE' ? 'DeleteTaskPushNotificationConfig' : 'GetTaskPushNotificationConfig'),
  },
  { pattern: /^\/tasks\/([^/:]+)$/, handle: handleGetTask, method: () => 'GetTask' },
];

export function registerRestBinding(app: FastifyInstance, deps: BindingDeps): void {
  const { service, gate, logger } = deps;
  app.route<{ Params: { agent: string; '*': string } }>({
    method: ['GET', 'POST', 'DELETE', 'PUT', 'PATCH'],
    url: '/a2a/:agent/*',
    handler: async (request, reply) => {
      const path = operationPath(request.url);
      const method = request.method;
      const guard = await gate(request, reply, request.params.agent);
      if (!guard.ok) return restFail(reply, guard.error);
      if (guard.activated.length) reply.header('a2a-extensions', guard.activated.join(', '));
      const call: RestCall = { request, reply, path, method, caller: guard.caller, activated: guard.activated, service, logger };
      for (const operation of restOperations) {
        const match = operation.pattern.exec(path);
        if (!match) continue;
        const handle = () =>
          operation.streaming
            ? holdingStreamSlot(guard.admission, (error) => restFail(reply, error), () => operation.handle(call, match), reply.raw)
            : operation.handle(call, match);
        if (!tracingEnabled()) return handle();
        const traced = {
          binding: 'rest' as const,
          method: operation.method(method),
          agentId: guard.caller.agent.config.id,
          clientId: guard.caller.clientId,
          traceparent: headerValue(request, 'traceparent'),
          tracestate: headerValue(request, 'tracestate'),
          taskId: match[1] === undefined ? undefined : (pathSegment(match[1]) ?? undefined),
        };
        return inA2AServerSpan(traced, handle);
      }
      return restFail(reply, A2AErrors.methodNotFound(`no A2A operation at ${method} ${path}`));
    },
  });
}
