import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { KeelLogger } from '../log/logger.js';
import {
  cancelTaskParamsSchema,
  createPushConfigParamsSchema,
  deletePushConfigParamsSchema,
  extendedCardParamsSchema,
  getPushConfigParamsSchema,
  getTaskParamsSchema,
  listPushConfigsParamsSchema,
  listTasksParamsSchema,
  sendMessageParamsSchema,
  subscribeParamsSchema,
} from '../protocol/wire.js';
import { A2AErrors, invalidParams, jsonRpcError, ok, type A2AError, type Result } from './a2a-error.js';
import type { A2AService, Caller, StreamItem } from './a2a-service.js';
import {
  challengeIfUnauthenticated,
  headerValue,
  holdingStreamSlot,
  idempotencyKeyOf,
  JSON_TYPES,
  mediaType,
  pacedBody,
  parseParams,
  responsePieces,
  retryAfterHeader,
  streamToSse,
  subscriptionOptions,
  type BindingDeps,
} from './binding-support.js';
import { inA2AServerSpan, noteA2AError, taskIdOfParams } from '../tracing/a2a-server-span.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';
import { resumePointOfParams } from './sequenced-events.js';
import { lastEventId } from './sse.js';

// The JSON-RPC 2.0 binding at POST /a2a/<agent>: the envelope is checked here, then the method's
// handler in jsonRpcMethods parses its params and calls the service.

type RpcId = string | number | null;

/** One JSON-RPC request that passed the gate and the envelope checks. */
export type JsonRpcCall = {
  request: FastifyRequest;
  reply: FastifyReply;
  id: RpcId;
  params: unknown;
  caller: Caller;
  activated: string[];
  service: A2AService;
  logger: KeelLogger;
};

export type JsonRpcMethodHandler = (call: JsonRpcCall) => Promise<unknown>;

// HTTP 200 but for a refused client (401), an agent that does not exist (404) and a client over its
// limits (429 with Retry-After, so proxies and HTTP clients see it; decision 0060).
function rpcError(reply: FastifyReply, id: RpcId, error: A2AError) {
  noteA2AError(error);
  challengeIfUnauthenticated(reply, error);
  retryAfterHeader(reply, error);
  const status =
    error.httpStatus === 401 || error.httpStatus === 429 ? error.httpStatus : error.httpStatus === 404 && error.code === A2AErrors.methodNotFound('').code && error.message.startsWith('no agent') ? 404 : 200;
  return reply.code(status).type('application/json').send({ jsonrpc: '2.0', id, error: jsonRpcError(error) });
}

const rpcResult = (reply: FastifyReply, id: RpcId, result: unknown) => reply.type('application/json').send({ jsonrpc: '2.0', id, result });

const answer = (call: JsonRpcCall, result: Result<unknown>) => (result.ok ? rpcResult(call.reply, call.id, result.value) : rpcError(call.reply, call.id, result.error));

/** A stream item in the JSON-RPC envelope, the response's JSON spliced in (shared by every stream, never copied). */
const rpcFrame = (id: RpcId) => {
  const head = `{"jsonrpc":"2.0","id":${JSON.stringify(id)},"result":`;
  return (item: StreamItem) => [head, ...responsePieces(item), '}'];
};

/**
 * The id of a JSON-RPC request body, for errors found before the envelope is checked (version,
 * extensions, authentication): JSON-RPC 2.0 answers with the request's id whenever it can be read.
 */
function envelopeId(body: unknown): RpcId {
  try {
    const parsed = JSON.parse(String(body ?? '')) as unknown;
    const id = typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>).id : undefined;
    return typeof id === 'string' || typeof id === 'number' ? id : null;
  } catch {
    return null;
  }
}

export async function handleSendMessage(call: JsonRpcCall) {
  const input = parseParams(sendMessageParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.sendMessage(call.caller, input.value, idempotencyKeyOf(call.request))) : answer(call, input);
}

export async function handleSendStreamingMessage(call: JsonRpcCall) {
  const { service, caller } = call;
  const input = parseParams(sendMessageParamsSchema, call.params);
  if (!input.ok) return answer(call, input);
  const accepted = await service.acceptMessage(caller, input.value, undefined, idempotencyKeyOf(call.request));
  if (!accepted.ok) return answer(call, accepted);
  const { taskId } = accepted.value;
  const continuing = input.value.message.taskId !== undefined;
  return streamToSse(
    call.logger,
    call.request,
    call.reply,
    (signal) => service.stream(caller, taskId, { signal, withSnapshot: true, ...(continuing ? { lastEventId: accepted.value.afterSequence } : { fromCreation: true }) }),
    rpcFrame(call.id),
    call.activated,
    service.streamFlow,
  );
}

export async function handleGetTask(call: JsonRpcCall) {
  const input = parseParams(getTaskParamsSchema, call.params);
  if (!input.ok) return answer(call, input);
  const shared = await call.service.getSharedTask(call.caller, input.value.id, input.value.historyLength);
  if (!shared.ok) return answer(call, shared);
  // The revision's JSON as its concurrent readers share it, spliced into the envelope without a copy.
  const pieces = [Buffer.from(`{"jsonrpc":"2.0","id":${JSON.stringify(call.id)},"result":`), shared.value.json, Buffer.from('}')];
  return pacedBody(call.reply.type('application/json'), call.service.streamFlow, pieces);
}

export async function handleListTasks(call: JsonRpcCall) {
  const input = parseParams(listTasksParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.listTasks(call.caller, input.value)) : answer(call, input);
}

export async function handleCancelTask(call: JsonRpcCall) {
  const input = parseParams(cancelTaskParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.cancelTask(call.caller, input.value.id)) : answer(call, input);
}

export async function handleSubscribeToTask(call: JsonRpcCall) {
  const { service, caller } = call;
  const input = parseParams(subscribeParamsSchema, call.params);
  if (!input.ok) return answer(call, input);
  // The sequenced-events extension's resume point in the params, else SSE's Last-Event-ID.
  const named = caller.sequenced ? resumePointOfParams(input.value.metadata) : ok(undefined);
  if (!named.ok) return answer(call, named);
  const resumeAfter = named.value ?? lastEventId(call.request);
  const check = await service.checkSubscribable(caller, input.value.id, resumeAfter);
  if (!check.ok) return answer(call, check);
  return streamToSse(
    call.logger,
    call.request,
    call.reply,
    (signal) => service.stream(caller, input.value.id, subscriptionOptions(caller, signal, resumeAfter)),
    rpcFrame(call.id),
    call.activated,
    service.streamFlow,
  );
}

export async function handleCreateTaskPushNotificationConfig(call: JsonRpcCall) {
  const input = parseParams(createPushConfigParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.createPushConfig(call.caller, input.value)) : answer(call, input);
}

export async function handleGetTaskPushNotificationConfig(call: JsonRpcCall) {
  const input = parseParams(getPushConfigParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.getPushConfig(call.caller, input.value.taskId, input.value.id)) : answer(call, input);
}

export async function handleListTaskPushNotificationConfigs(call: JsonRpcCall) {
  const input = parseParams(listPushConfigsParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.listPushConfigs(call.caller, input.value.taskId, input.value.pageSize, input.value.pageToken)) : answer(call, input);
}

export async function handleDeleteTaskPushNotificationConfig(call: JsonRpcCall) {
  const input = parseParams(deletePushConfigParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.deletePushConfig(call.caller, input.value.taskId, input.value.id)) : answer(call, input);
}

export async function handleGetExtendedAgentCard(call: JsonRpcCall) {
  const input = parseParams(extendedCardParamsSchema, call.params);
  return input.ok ? answer(call, await call.service.extendedCard(call.caller)) : answer(call, input);
}

/** The A2A 1.0 methods by their JSON-RPC names. */
export const jsonRpcMethods: Readonly<Record<string, JsonRpcMethodHandler>> = {
  SendMessage: handleSendMessage,
  SendStreamingMessage: handleSendStreamingMessage,
  GetTask: handleGetTask,
  ListTasks: handleListTasks,
  CancelTask: handleCancelTask,
  SubscribeToTask: handleSubscribeToTask,
  CreateTaskPushNotificationConfig: handleCreateTaskPushNotificationConfig,
  GetTaskPushNotificationConfig: handleGetTaskPushNotificationConfig,
  ListTaskPushNotificationConfigs: handleListTaskPushNotificationConfigs,
  DeleteTaskPushNotificationConfig: handleDeleteTaskPushNotificationConfig,
  GetExtendedAgentCard: handleGetExtendedAgentCard,
};

/** The methods that answer with a stream: each holds one of the client's open-stream slots while it runs. */
const STREAMING_METHODS: ReadonlySet<string> = new Set(['SendStreamingMessage', 'SubscribeToTask']);

/** The handler of a method name; own keys only, so "toString" or "__proto__" is no method. */
export function jsonRpcMethod(name: string): JsonRpcMethodHandler | undefined {
  return Object.hasOwn(jsonRpcMethods, name) ? jsonRpcMethods[name] : undefined;
}

export function registerJsonRpcBinding(app: FastifyInstance, deps: BindingDeps): void {
  const { service, gate, logger } = deps;
  const rpcHandler = async (request: FastifyRequest<{ Params: { agent: string } }>, reply: FastifyReply) => {
    const guard = await gate(request, reply, request.params.agent);
    if (!guard.ok) return rpcError(reply, envelopeId(request.body), guard.error);
    if (guard.activated.length) reply.header('a2a-extensions', guard.activated.join(', '));
    const type = mediaType(request);
    if (!JSON_TYPES.has(type)) return rpcError(reply, null, A2AErrors.contentTypeNotSupported(`content type ${type || '(none)'} is not supported; send application/json`));
    let envelope: unknown;
    try {
      envelope = JSON.parse(String(request.body ?? ''));
    } catch (error) {
      return rpcError(reply, null, A2AErrors.parse(`the body is not valid JSON: ${(error as Error).message}`));
    }
    if (typeof envelope !== 'object' || envelope === null || Array.isArray(envelope)) {
      return rpcError(reply, null, A2AErrors.invalidRequest(Array.isArray(envelope) ? 'batch requests are not supported' : 'a JSON-RPC request is an object'));
    }
    const { jsonrpc, method, params, id: rawId } = envelope as Record<string, unknown>;
    const id: RpcId = typeof rawId === 'string' || typeof rawId === 'number' ? rawId : null;
    if (jsonrpc !== '2.0' || typeof method !== 'string' || (rawId !== undefined && rawId !== null && id === null)) {
      return rpcError(reply, id, A2AErrors.invalidRequest('expected {"jsonrpc": "2.0", "method": <string>, "id": <string|number>, "params": <object>}'));
    }
    if (params !== undefined && (typeof params !== 'object' || params === null || Array.isArray(params))) {
      return rpcError(reply, id, invalidParams([{ path: [], message: 'params must be an object' }]));
    }
    const handler = jsonRpcMethod(method);
    if (!handler) return rpcError(reply, id, A2AErrors.methodNotFound(`method ${method} does not exist (A2A 1.0 names, e.g. SendMessage)`));
    const call = () => handler({ request, reply, id, params, caller: guard.caller, activated: guard.activated, service, logger });
    const handle = () => (STREAMING_METHODS.has(method) ? holdingStreamSlot(guard.admission, (error) => rpcError(reply, id, error), call, reply.raw) : call());
    if (!tracingEnabled()) return handle();
    const traced = {
      binding: 'jsonrpc' as const,
      method,
      agentId: guard.caller.agent.config.id,
      clientId: guard.caller.clientId,
      traceparent: headerValue(request, 'traceparent'),
      tracestate: headerValue(request, 'tracestate'),
      taskId: taskIdOfParams(params),
    };
    return inA2AServerSpan(traced, handle);
  };
  // The interface URL exactly, and with a trailing slash (clients that join "/" onto the URL, as
  // the conformance kit's httpx client does); no HTTP+JSON operation lives at POST /a2a/<agent>/.
  app.post<{ Params: { agent: string } }>('/a2a/:agent', rpcHandler);
  app.post<{ Params: { agent: string } }>('/a2a/:agent/', rpcHandler);
}
