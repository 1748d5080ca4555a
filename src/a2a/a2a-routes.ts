import { createHash } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import type { AgentRegistry, RegisteredAgent } from '../agents/agent-registry.js';
import type { ClientAuthenticator } from '../auth/client-authenticator.js';
import type { KeelConfig } from '../config/load-config.js';
import type { KeelLogger } from '../log/logger.js';
import { A2AErrors, invalidParams, jsonRpcError, restError, type A2AError, type Result } from './a2a-error.js';
import type { A2AService, Caller, StreamItem } from './a2a-service.js';
import { buildAgentCard } from './agent-card.js';
import { withJsonNames } from './proto-json.js';
import { lastEventId, openSse } from './sse.js';
import {
  cancelTaskParamsSchema,
  createPushConfigParamsSchema,
  deletePushConfigParamsSchema,
  extendedCardParamsSchema,
  getPushConfigParamsSchema,
  getTaskParamsSchema,
  listPushConfigsParamsSchema,
  listTasksParamsSchema,
  MAX_JSON_DEPTH,
  nestsDeeperThan,
  sendMessageParamsSchema,
  subscribeParamsSchema,
} from '../protocol/wire.js';

// The two bindings of the A2A service: JSON-RPC 2.0 at /a2a/<agent> and HTTP+JSON under
// /a2a/<agent>/, plus the agent cards. Both check, in this order: the agent exists, the client is
// authenticated, A2A-Version is 1.0, required extensions are requested; then the params.

export type A2ARouteDeps = {
  service: A2AService;
  registry: AgentRegistry;
  authenticator: ClientAuthenticator;
  config: KeelConfig;
  logger: KeelLogger;
};

const A2A_JSON = 'application/a2a+json';
// Major.Minor 1.0 (a patch number is ignored, specification 3.6); 1.1 or 2.0 is not this version.
const SUPPORTED_VERSION = /^1(\.0(\.\d+)?)?$/;
const JSON_TYPES = new Set(['application/json', A2A_JSON]);

type Gate = { ok: true; caller: Caller; activated: string[] } | { ok: false; error: A2AError };

function headerValue(request: FastifyRequest, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

function requestedVersion(request: FastifyRequest): string | undefined {
  const header = headerValue(request, 'a2a-version');
  if (header !== undefined) return header.trim();
  const query = request.query as Record<string, unknown> | undefined;
  const value = query?.['A2A-Version'];
  return typeof value === 'string' ? value.trim() : undefined;
}

const mediaType = (request: FastifyRequest) => (headerValue(request, 'content-type') ?? '').split(';')[0]!.trim().toLowerCase();

/**
 * The id of a JSON-RPC request body, for errors found before the envelope is checked (version,
 * extensions, authentication): JSON-RPC 2.0 answers with the request's id whenever it can be read.
 */
function envelopeId(body: unknown): string | number | null {
  try {
    const parsed = JSON.parse(String(body ?? '')) as unknown;
    const id = typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>).id : undefined;
    return typeof id === 'string' || typeof id === 'number' ? id : null;
  } catch {
    return null;
  }
}

/** A parse of zod params into the service's input, or an invalid-params error naming each field. */
function parse<S extends z.ZodTypeAny>(schema: S, value: unknown): Result<z.output<S>> {
  if (nestsDeeperThan(value, MAX_JSON_DEPTH)) return { ok: false, error: invalidParams([{ path: [], message: `nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels` }]) };
  const parsed = schema.safeParse(withJsonNames(value ?? {}));
  return parsed.success ? { ok: true, value: parsed.data } : { ok: false, error: invalidParams(parsed.error.issues) };
}

/**
 * The HTTP+JSON operation path under /a2a/<agent> as the client sent it, still percent-encoded.
 * Fastify's wildcard param is decoded already, so decoding its ids again read "%2541" as "A" and
 * threw on "%25" followed by no hex digits (a 500); it also turned an encoded "/" or ":" in an id
 * into a separator. Matching the raw path and decoding each id once (pathSegment) avoids all three.
 */
function operationPath(url: string): string {
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

export function registerA2ARoutes(app: FastifyInstance, deps: A2ARouteDeps): void {
  const { service, registry, authenticator, config, logger } = deps;
  const startedAt = new Date();
  startedAt.setMilliseconds(0);
  // Built on first use: with port 0 the public URL is only known once the server listens.
  const cards = new Map<string, { body: string; etag: string }>();
  const cardOf = (id: string) => {
    let card = cards.get(id);
    const agent = registry.get(id);
    if (!card && agent) {
      const body = JSON.stringify(buildAgentCard(agent.config, config));
      card = { body, etag: `"${createHash('sha256').update(body).digest('base64url').slice(0, 27)}"` };
      cards.set(id, card);
    }
    return card;
  };

  // Bodies arrive as text so malformed JSON becomes the binding's own error, never a 500.
  app.addContentTypeParser(['application/json', A2A_JSON], { parseAs: 'string' }, (_request, body, done) => done(null, body));
  app.addContentTypeParser('*', { parseAs: 'string' }, (_request, body, done) => done(null, body));

  const sendCard = (request: FastifyRequest, reply: FastifyReply, agentId: string) => {
    const card = cardOf(agentId);
    if (!card) return reply.code(404).type('application/json').send({ error: { code: 404, status: 'NOT_FOUND', message: `no agent ${agentId}` } });
    reply
      .header('cache-control', 'public, max-age=300')
      .header('etag', card.etag)
      .header('last-modified', startedAt.toUTCString());
    const match = headerValue(request, 'if-none-match');
    const since = headerValue(request, 'if-modified-since');
    if ((match !== undefined && match.split(',').some((tag) => tag.trim() === card.etag || tag.trim() === '*')) || (match === undefined && since !== undefined && Date.parse(since) >= startedAt.getTime())) {
      return reply.code(304).send();
    }
    return reply.type('application/json').send(card.body);
  };
  app.get('/.well-known/agent-card.json', (request, reply) => sendCard(request, reply, registry.defaultAgentId));
  app.get<{ Params: { agent: string } }>('/a2a/:agent/.well-known/agent-card.json', (request, reply) => sendCard(request, reply, request.params.agent));

  async function gate(request: FastifyRequest, agentId: string): Promise<Gate> {
    const agent: RegisteredAgent | undefined = registry.get(agentId);
    if (!agent) return { ok: false, error: A2AErrors.methodNotFound(`no agent ${agentId}`, { httpStatus: 404 }) };
    const auth = await authenticator.authenticate(headerValue(request, 'authorization'));
    if (!auth.ok) {
      return { ok: false, error: A2AErrors.unauthenticated(auth.reason === 'missing' ? 'authentication required: Authorization: Bearer <client token>' : 'the client token is not valid') };
    }
    const version = requestedVersion(request);
    if (version === undefined || !SUPPORTED_VERSION.test(version)) {
      return {
        ok: false,
        error: A2AErrors.versionNotSupported(`A2A-Version ${version ?? '(absent, meaning 0.3)'} is not supported; this server speaks 1.0`, { metadata: { supported: '1.0' } }),
      };
    }
    const requested = (headerValue(request, 'a2a-extensions') ?? '').split(',').map((uri) => uri.trim()).filter(Boolean);
    const missing = agent.config.extensions.filter((extension) => extension.required && !requested.includes(extension.uri));
    if (missing.length > 0) {
      return {
        ok: false,
        error: A2AErrors.extensionSupportRequired(`this agent requires the extension ${missing.map((extension) => extension.uri).join(', ')}; request it with A2A-Extensions`, {
          metadata: { extensions: missing.map((extension) => extension.uri).join(',') },
        }),
      };
    }
    const activated = requested.filter((uri) => agent.config.extensions.some((extension) => extension.uri === uri));
    return { ok: true, caller: { clientId: auth.client.id, agent }, activated };
  }

  const unauthenticated = (reply: FastifyReply, error: A2AError) => {
    if (error.httpStatus === 401) reply.header('www-authenticate', 'Bearer realm="keel"');
  };

  // ---- JSON-RPC ----

  type RpcId = string | number | null;
  const rpcError = (reply: FastifyReply, id: RpcId, error: A2AError) => {
    unauthenticated(reply, error);
    const status = error.httpStatus === 401 ? 401 : error.httpStatus === 404 && error.code === A2AErrors.methodNotFound('').code && error.message.startsWith('no agent') ? 404 : 200;
    return reply.code(status).type('application/json').send({ jsonrpc: '2.0', id, error: jsonRpcError(error) });
  };
  const rpcResult = (reply: FastifyReply, id: RpcId, result: unknown) => reply.type('application/json').send({ jsonrpc: '2.0', id, result });

  async function streamToSse(request: FastifyRequest, reply: FastifyReply, items: (signal: AbortSignal) => AsyncGenerator<StreamItem>, frame: (item: StreamItem) => unknown, activated: string[]) {
    const sse = openSse(request, reply, activated.length ? { 'a2a-extensions': activated.join(', ') } : {});
    try {
      for await (const item of items(sse.signal)) {
        if (!sse.send(item.id, frame(item)) && sse.signal.aborted) break;
      }
    } catch (error) {
      logger.warn({ err: error }, 'stream ended by an error');
    } finally {
      sse.close();
    }
  }

  // The interface URL exactly, and with a trailing slash (clients that join "/" onto the URL, as
  // the conformance kit's httpx client does); no HTTP+JSON operation lives at POST /a2a/<agent>/.
  const rpcHandler = async (request: FastifyRequest<{ Params: { agent: string } }>, reply: FastifyReply) => {
    const guard = await gate(request, request.params.agent);
    if (!guard.ok) return rpcError(reply, envelopeId(request.body), guard.error);
    if (guard.activated.length) reply.header('a2a-extensions', guard.activated.join(', '));
    const type = mediaType(request);
    if (!JSON_TYPES.has(type)) return rpcError(reply, null, A2AErrors.invalidRequest(`content type ${type || '(none)'} is not JSON; send application/json`));
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
    const { caller } = guard;
    const answer = (result: Result<unknown>) => (result.ok ? rpcResult(reply, id, result.value) : rpcError(reply, id, result.error));

    switch (method) {
      case 'SendMessage': {
        const input = parse(sendMessageParamsSchema, params);
        return input.ok ? answer(await service.sendMessage(caller, input.value)) : answer(input);
      }
      case 'SendStreamingMessage': {
        const input = parse(sendMessageParamsSchema, params);
        if (!input.ok) return answer(input);
        const accepted = await service.acceptMessage(caller, input.value);
        if (!accepted.ok) return answer(accepted);
        const { taskId } = accepted.value;
        const continuing = input.value.message.taskId !== undefined;
        return streamToSse(
          request,
          reply,
          (signal) => service.stream(caller, taskId, { signal, withSnapshot: true, ...(continuing ? { lastEventId: accepted.value.afterSequence } : { fromCreation: true }) }),
          (item) => ({ jsonrpc: '2.0', id, result: item.response }),
          guard.activated,
        );
      }
      case 'GetTask': {
        const input = parse(getTaskParamsSchema, params);
        return input.ok ? answer(await service.getTask(caller, input.value.id, input.value.historyLength)) : answer(input);
      }
      case 'ListTasks': {
        const input = parse(listTasksParamsSchema, params);
        return input.ok ? answer(await service.listTasks(caller, input.value)) : answer(input);
      }
      case 'CancelTask': {
        const input = parse(cancelTaskParamsSchema, params);
        return input.ok ? answer(await service.cancelTask(caller, input.value.id)) : answer(input);
      }
      case 'SubscribeToTask': {
        const input = parse(subscribeParamsSchema, params);
        if (!input.ok) return answer(input);
        const check = await service.checkSubscribable(caller, input.value.id);
        if (!check.ok) return answer(check);
        const resumeAfter = lastEventId(request);
        return streamToSse(
          request,
          reply,
          (signal) => service.stream(caller, input.value.id, { signal, withSnapshot: true, subscription: true, ...(resumeAfter !== undefined ? { lastEventId: resumeAfter } : {}) }),
          (item) => ({ jsonrpc: '2.0', id, result: item.response }),
          guard.activated,
        );
      }
      case 'CreateTaskPushNotificationConfig': {
        const input = parse(createPushConfigParamsSchema, params);
        return input.ok ? answer(await service.createPushConfig(caller, input.value)) : answer(input);
      }
      case 'GetTaskPushNotificationConfig': {
        const input = parse(getPushConfigParamsSchema, params);
        return input.ok ? answer(await service.getPushConfig(caller, input.value.taskId, input.value.id)) : answer(input);
      }
      case 'ListTaskPushNotificationConfigs': {
        const input = parse(listPushConfigsParamsSchema, params);
        return input.ok ? answer(await service.listPushConfigs(caller, input.value.taskId, input.value.pageSize, input.value.pageToken)) : answer(input);
      }
      case 'DeleteTaskPushNotificationConfig': {
        const input = parse(deletePushConfigParamsSchema, params);
        return input.ok ? answer(await service.deletePushConfig(caller, input.value.taskId, input.value.id)) : answer(input);
      }
      case 'GetExtendedAgentCard': {
        const input = parse(extendedCardParamsSchema, params);
        return input.ok ? answer(service.extendedCard(caller)) : answer(input);
      }
      default:
        return rpcError(reply, id, A2AErrors.methodNotFound(`method ${method} does not exist (A2A 1.0 names, e.g. SendMessage)`));
    }
  };
  app.post<{ Params: { agent: string } }>('/a2a/:agent', rpcHandler);
  app.post<{ Params: { agent: string } }>('/a2a/:agent/', rpcHandler);

  // ---- HTTP+JSON ----

  const restFail = (reply: FastifyReply, error: A2AError) => {
    unauthenticated(reply, error);
    return reply.code(error.httpStatus).type(A2A_JSON).send(restError(error));
  };
  const restAnswer = (reply: FastifyReply, result: Result<unknown>, created = false) =>
    result.ok ? reply.code(created ? 200 : 200).type(A2A_JSON).send(result.value) : restFail(reply, result.error);

  const NUMBER_QUERY = new Set(['pageSize', 'historyLength']);
  const BOOLEAN_QUERY = new Set(['includeArtifacts']);
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
      // The request's own media type: HTTP's 415 (a part's media type is the 400 of specification 5.4).
      return { ok: false, error: A2AErrors.contentTypeNotSupported(`content type ${type || '(none)'} is not supported; send ${A2A_JSON} or application/json`, { httpStatus: 415 }) };
    }
    try {
      return { ok: true, value: JSON.parse(String(request.body ?? '')) };
    } catch (error) {
      return { ok: false, error: A2AErrors.parse(`the body is not valid JSON: ${(error as Error).message}`) };
    }
  }

  app.route<{ Params: { agent: string; '*': string } }>({
    method: ['GET', 'POST', 'DELETE', 'PUT', 'PATCH'],
    url: '/a2a/:agent/*',
    handler: async (request, reply) => {
      const path = operationPath(request.url);
      const method = request.method;
      const guard = await gate(request, request.params.agent);
      if (!guard.ok) return restFail(reply, guard.error);
      if (guard.activated.length) reply.header('a2a-extensions', guard.activated.join(', '));
      const { caller } = guard;
      const body = () => jsonBody(request);

      let match: RegExpExecArray | null;
      if (path === '/message:send' || path === '/message:stream') {
        if (method !== 'POST') return restFail(reply, A2AErrors.methodNotFound(`${method} ${path} is not supported; use POST`, { httpStatus: 405 }));
        const raw = body();
        if (!raw.ok) return restFail(reply, raw.error);
        const input = parse(sendMessageParamsSchema, raw.value);
        if (!input.ok) return restFail(reply, input.error);
        if (path === '/message:send') return restAnswer(reply, await service.sendMessage(caller, input.value));
        const accepted = await service.acceptMessage(caller, input.value);
        if (!accepted.ok) return restFail(reply, accepted.error);
        const continuing = input.value.message.taskId !== undefined;
        return streamToSse(
          request,
          reply,
          (signal) => service.stream(caller, accepted.value.taskId, { signal, withSnapshot: true, ...(continuing ? { lastEventId: accepted.value.afterSequence } : { fromCreation: true }) }),
          (item) => item.response,
          guard.activated,
        );
      }
      if (path === '/tasks') {
        if (method !== 'GET') return restFail(reply, A2AErrors.methodNotFound(`${method} /tasks is not supported; use GET`, { httpStatus: 405 }));
        const input = parse(listTasksParamsSchema, queryParams(request));
        return input.ok ? restAnswer(reply, await service.listTasks(caller, input.value)) : restFail(reply, input.error);
      }
      if (path === '/extendedAgentCard') {
        if (method !== 'GET') return restFail(reply, A2AErrors.methodNotFound(`${method} ${path} is not supported; use GET`, { httpStatus: 405 }));
        return restAnswer(reply, service.extendedCard(caller));
      }
      if ((match = /^\/tasks\/([^/:]+):cancel$/.exec(path))) {
        if (method !== 'POST') return restFail(reply, A2AErrors.methodNotFound(`${method} ${path} is not supported; use POST`, { httpStatus: 405 }));
        const taskId = pathSegment(match[1]!);
        if (taskId === null) return restFail(reply, badSegment('id'));
        return restAnswer(reply, await service.cancelTask(caller, taskId));
      }
      if ((match = /^\/tasks\/([^/:]+):subscribe$/.exec(path))) {
        if (method !== 'POST' && method !== 'GET') return restFail(reply, A2AErrors.methodNotFound(`${method} ${path} is not supported; use POST or GET`, { httpStatus: 405 }));
        const taskId = pathSegment(match[1]!);
        if (taskId === null) return restFail(reply, badSegment('id'));
        const check = await service.checkSubscribable(caller, taskId);
        if (!check.ok) return restFail(reply, check.error);
        const resumeAfter = lastEventId(request);
        return streamToSse(
          request,
          reply,
          (signal) => service.stream(caller, taskId, { signal, withSnapshot: true, subscription: true, ...(resumeAfter !== undefined ? { lastEventId: resumeAfter } : {}) }),
          (item) => item.response,
          guard.activated,
        );
      }
      if ((match = /^\/tasks\/([^/:]+)\/pushNotificationConfigs$/.exec(path))) {
        const taskId = pathSegment(match[1]!);
        if (taskId === null) return restFail(reply, badSegment('taskId'));
        if (method === 'POST') {
          const raw = body();
          if (!raw.ok) return restFail(reply, raw.error);
          const input = parse(createPushConfigParamsSchema, { ...(typeof raw.value === 'object' && raw.value !== null ? raw.value : {}), taskId });
          return input.ok ? restAnswer(reply, await service.createPushConfig(caller, input.value)) : restFail(reply, input.error);
        }
        if (method === 'GET') {
          const input = parse(listPushConfigsParamsSchema, { ...queryParams(request), taskId });
          return input.ok ? restAnswer(reply, await service.listPushConfigs(caller, taskId, input.value.pageSize, input.value.pageToken)) : restFail(reply, input.error);
        }
        return restFail(reply, A2AErrors.methodNotFound(`${method} ${path} is not supported`, { httpStatus: 405 }));
      }
      if ((match = /^\/tasks\/([^/:]+)\/pushNotificationConfigs\/([^/]+)$/.exec(path))) {
        if (method !== 'GET' && method !== 'DELETE') return restFail(reply, A2AErrors.methodNotFound(`${method} ${path} is not supported`, { httpStatus: 405 }));
        // Through the params schema like JSON-RPC, so both bindings refuse the same ids.
        const [taskId, id] = [pathSegment(match[1]!), pathSegment(match[2]!)];
        if (taskId === null || id === null) return restFail(reply, badSegment(taskId === null ? 'taskId' : 'id'));
        const input = parse(getPushConfigParamsSchema, { taskId, id });
        if (!input.ok) return restFail(reply, input.error);
        const { value } = input;
        return restAnswer(reply, method === 'GET' ? await service.getPushConfig(caller, value.taskId, value.id) : await service.deletePushConfig(caller, value.taskId, value.id));
      }
      if ((match = /^\/tasks\/([^/:]+)$/.exec(path))) {
        if (method !== 'GET') return restFail(reply, A2AErrors.methodNotFound(`${method} ${path} is not supported; use GET`, { httpStatus: 405 }));
        const id = pathSegment(match[1]!);
        if (id === null) return restFail(reply, badSegment('id'));
        const input = parse(getTaskParamsSchema, { ...queryParams(request), id });
        return input.ok ? restAnswer(reply, await service.getTask(caller, input.value.id, input.value.historyLength)) : restFail(reply, input.error);
      }
      return restFail(reply, A2AErrors.methodNotFound(`no A2A operation at ${method} ${path}`));
    },
  });

  /** Errors Fastify raises before a handler runs (body too large, broken encodings) in each binding's own shape. */
  app.setErrorHandler((error: { statusCode?: number; code?: string; message: string }, request, reply) => {
    const tooLarge = error.code === 'FST_ERR_CTP_BODY_TOO_LARGE' || error.statusCode === 413;
    const a2aError = tooLarge
      ? A2AErrors.payloadTooLarge(`the request body is larger than ${config.server.bodyLimitBytes} bytes`)
      : (error.statusCode ?? 500) < 500
        ? A2AErrors.invalidRequest(error.message)
        : A2AErrors.internal('internal error');
    if ((error.statusCode ?? 500) >= 500) logger.error({ err: error, url: request.url }, 'request failed');
    const isRpc = request.method === 'POST' && /^\/a2a\/[^/]+\/?$/.test(request.url.split('?')[0]!);
    if (isRpc) return reply.code(tooLarge ? 200 : a2aError.httpStatus === 500 ? 500 : 200).type('application/json').send({ jsonrpc: '2.0', id: null, error: jsonRpcError(a2aError) });
    return reply.code(a2aError.httpStatus).type(A2A_JSON).send(restError(a2aError));
  });
}
