import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { ClientAuthenticator } from '../auth/client-authenticator.js';
import type { KeelConfig } from '../config/load-config.js';
import type { ClientLimits } from '../limits/client-limits.js';
import type { KeelLogger } from '../log/logger.js';
import { A2AErrors, jsonRpcError, restError, type A2AError } from './a2a-error.js';
import type { A2AService } from './a2a-service.js';
import { A2A_JSON, headerValue, RESPONSE_JSON, type Gate, type RequestGate } from './binding-support.js';
import { registerCardRoutes } from './card-routes.js';
import { registerJsonRpcBinding } from './json-rpc-binding.js';
import { registerRestBinding } from './rest-binding.js';
import { SEQUENCED_EVENTS_URI, sequencedEventsActivated } from './sequenced-events.js';

// The two HTTP bindings of the A2A service, JSON-RPC 2.0 at /a2a/<agent> (json-rpc-binding.ts) and
// HTTP+JSON under /a2a/<agent>/ (rest-binding.ts), plus the agent cards (card-routes.ts). Every
// binding, gRPC (grpc-binding.ts, on its own port) too, checks in this order: the agent exists,
// the client is authenticated, it is within its limits (src/limits/), A2A-Version is 1.0,
// required extensions are requested (the gate below); then the params.

export type A2ARouteDeps = {
  service: A2AService;
  registry: AgentRegistry;
  authenticator: ClientAuthenticator;
  config: KeelConfig;
  logger: KeelLogger;
  limits: ClientLimits<A2AError>;
};

// Major.Minor 1.0 (a patch number is ignored, specification 3.6); 1.1 or 2.0 is not this version.
const SUPPORTED_VERSION = /^1(\.0(\.\d+)?)?$/;

function requestedVersion(request: FastifyRequest): string | undefined {
  const header = headerValue(request, 'a2a-version');
  if (header !== undefined) return header.trim();
  const query = request.query as Record<string, unknown> | undefined;
  const value = query?.['A2A-Version'];
  return typeof value === 'string' ? value.trim() : undefined;
}

/** What the gate reads of a request, whichever binding carried it (HTTP headers, gRPC metadata). */
export type GateInput = {
  agentId: string;
  /** The `Authorization` value. */
  authorization: string | undefined;
  /** The `A2A-Version` value; absent means 0.3. */
  version: string | undefined;
  /** The `A2A-Extensions` value: comma-separated URIs. */
  extensions: string | undefined;
};

/**
 * The checks every A2A request passes, in every binding, before its params are read: the agent
 * exists, the client is authenticated and within its limits (a request refused later gives its
 * slot back at once), A2A-Version is 1.0, required extensions are requested.
 */
export function createServiceGate(registry: AgentRegistry, authenticator: ClientAuthenticator, limits: ClientLimits<A2AError>): (input: GateInput) => Promise<Gate> {
  return async (input: GateInput): Promise<Gate> => {
    const agent = registry.get(input.agentId);
    if (!agent) return { ok: false, error: A2AErrors.methodNotFound(`no agent ${input.agentId}`, { httpStatus: 404 }) };
    const auth = await authenticator.authenticate(input.authorization);
    if (!auth.ok) {
      return { ok: false, error: A2AErrors.unauthenticated(auth.reason === 'missing' ? 'authentication required: Authorization: Bearer <client token>' : 'the client token is not valid') };
    }
    const admitted = limits.admitRequest(auth.client);
    if (!admitted.ok) return admitted;
    const version = input.version?.trim();
    if (version === undefined || !SUPPORTED_VERSION.test(version)) {
      admitted.admission.release();
      return {
        ok: false,
        error: A2AErrors.versionNotSupported(`A2A-Version ${version ?? '(absent, meaning 0.3)'} is not supported; this server speaks 1.0`, { metadata: { supported: '1.0' } }),
      };
    }
    const requested = (input.extensions ?? '').split(',').map((uri) => uri.trim()).filter(Boolean);
    const missing = agent.config.extensions.filter((extension) => extension.required && !requested.includes(extension.uri));
    if (missing.length > 0) {
      admitted.admission.release();
      return {
        ok: false,
        error: A2AErrors.extensionSupportRequired(`this agent requires the extension ${missing.map((extension) => extension.uri).join(', ')}; request it with A2A-Extensions`, {
          metadata: { extensions: missing.map((extension) => extension.uri).join(',') },
        }),
      };
    }
    // The agent's own extensions and Keel's, which every agent supports (sequenced-events.ts).
    const activated = requested.filter((uri) => uri === SEQUENCED_EVENTS_URI || agent.config.extensions.some((extension) => extension.uri === uri));
    return { ok: true, caller: { clientId: auth.client.id, agent, sequenced: sequencedEventsActivated(activated) }, activated, admission: admitted.admission };
  };
}

/**
 * The service gate for the HTTP bindings: the values come from headers (the version also from
 * `?A2A-Version=`); the request slot is given back when the response closes (sent, or the
 * connection gone), a stream's once it holds a stream slot instead.
 */
export function createRequestGate(registry: AgentRegistry, authenticator: ClientAuthenticator, limits: ClientLimits<A2AError>): RequestGate {
  const check = createServiceGate(registry, authenticator, limits);
  return async (request: FastifyRequest, reply: FastifyReply, agentId: string): Promise<Gate> => {
    const gate = await check({
      agentId,
      authorization: headerValue(request, 'authorization'),
      version: requestedVersion(request),
      // A2A 1.0's name, or 0.3's (X-A2A-Extensions) from a client that still sends it; the echo is A2A-Extensions.
      extensions: headerValue(request, 'a2a-extensions') ?? headerValue(request, 'x-a2a-extensions'),
    });
    if (gate.ok) {
      // A client gone during the checks had its 'close' already: none is to come.
      if (reply.raw.destroyed) gate.admission.release();
      else reply.raw.once('close', gate.admission.release);
    }
    return gate;
  };
}

export function registerA2ARoutes(app: FastifyInstance, deps: A2ARouteDeps): void {
  const { service, registry, authenticator, config, logger, limits } = deps;

  // Bodies arrive as text so malformed JSON becomes the binding's own error, never a 500.
  app.addContentTypeParser(['application/json', A2A_JSON], { parseAs: 'string' }, (_request, body, done) => done(null, body));
  app.addContentTypeParser('*', { parseAs: 'string' }, (_request, body, done) => done(null, body));

  registerCardRoutes(app, { registry, cards: service.cards });
  const gate = createRequestGate(registry, authenticator, limits);
  registerJsonRpcBinding(app, { service, gate, logger });
  registerRestBinding(app, { service, gate, logger });

  /** Errors Fastify raises before a handler runs (body too large, broken encodings) in each binding's own shape. */
  app.setErrorHandler((error: { statusCode?: number; code?: string; message: string }, request, reply) => {
    const tooLarge = error.code === 'FST_ERR_CTP_BODY_TOO_LARGE' || error.statusCode === 413;
    const a2aError = tooLarge
      ? A2AErrors.payloadTooLarge(`the request body is larger than ${config.server.bodyLimitBytes} bytes`)
      : (error.statusCode ?? 500) < 500
        ? A2AErrors.invalidRequest(error.message)
        : A2AErrors.internal('internal error');
    if ((error.statusCode ?? 500) >= 500) logger.error({ err: error, url: request.url }, 'request failed');
    const answer = a2aErrorAnswer(request.method, request.url, a2aError);
    return reply.code(answer.status).type(answer.contentType).send(answer.body);
  });
}

/** An answer written before (or without) a route: its status, content type and body. */
export type ErrorAnswer = { status: number; contentType: string; body: string };

/**
 * An A2A error in the shape of the binding a request was addressed to: a POST to /a2a/<agent> is a
 * JSON-RPC call and gets its error object (HTTP 200, as every JSON-RPC error but an internal one);
 * anything else under /a2a/<agent> gets the HTTP+JSON error with the error's HTTP status.
 */
export function a2aErrorAnswer(method: string, url: string, error: A2AError): ErrorAnswer {
  const isRpc = method === 'POST' && /^\/a2a\/[^/]+\/?$/.test(url.split('?')[0]!);
  if (isRpc) return { status: error.httpStatus === 500 ? 500 : 200, contentType: 'application/json', body: JSON.stringify({ jsonrpc: '2.0', id: null, error: jsonRpcError(error) }) };
  return { status: error.httpStatus, contentType: RESPONSE_JSON, body: JSON.stringify(restError(error)) };
}

/** Whether a request line's target is under an A2A agent's endpoint (its JSON-RPC or HTTP+JSON binding or its card). */
export function isA2AAgentPath(url: string): boolean {
  return /^\/a2a\/[^/?#]+(\/|\?|$)/.test(url);
}

/**
 * The answer to a request refused before routing (a URL Fastify cannot decode, a path parameter over
 * its length limit, headers larger than Node's parser accepts): under an A2A agent's endpoint, the
 * binding's error shape with the refusal's HTTP status; elsewhere a plain JSON error. Never HTML.
 */
export function refusedRequestAnswer(method: string | null, url: string | null, status: number, message: string): ErrorAnswer {
  if (method !== null && url !== null && isA2AAgentPath(url)) return a2aErrorAnswer(method, url, { ...A2AErrors.invalidRequest(message), httpStatus: status });
  return { status, contentType: 'application/json', body: JSON.stringify({ error: message, statusCode: status }) };
}
