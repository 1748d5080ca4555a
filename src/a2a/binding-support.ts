import type { FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import type { KeelLogger } from '../log/logger.js';
import { MAX_JSON_DEPTH, nestsDeeperThan } from '../protocol/wire.js';
import { invalidParams, type A2AError, type Result } from './a2a-error.js';
import type { A2AService, Caller, StreamItem } from './a2a-service.js';
import { withJsonNames } from './proto-json.js';
import { openSse } from './sse.js';

// What the JSON-RPC and the HTTP+JSON bindings share: the request's checks (run by a2a-routes.ts,
// handed to each binding), media types, the params parse and the SSE stream of a task.

export const A2A_JSON = 'application/a2a+json';
/** Both JSON media types are read; JSON-RPC and HTTP+JSON answer in this one (specification 9.1, 11.1). */
export const RESPONSE_JSON = 'application/json';
export const JSON_TYPES = new Set([RESPONSE_JSON, A2A_JSON]);

/** The outcome of the checks every A2A request passes before its params are read. */
export type Gate = { ok: true; caller: Caller; activated: string[] } | { ok: false; error: A2AError };

/** Checks a request to an agent: the agent exists, the client is authenticated, the version and extensions. */
export type RequestGate = (request: FastifyRequest, agentId: string) => Promise<Gate>;

export type BindingDeps = { service: A2AService; gate: RequestGate; logger: KeelLogger };

export function headerValue(request: FastifyRequest, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** The `Idempotency-Key` header, the key a client may name its message by instead of the messageId (decision 0064). */
export const idempotencyKeyOf = (request: FastifyRequest) => ({ idempotencyKey: headerValue(request, 'idempotency-key') });

export const mediaType = (request: FastifyRequest) => (headerValue(request, 'content-type') ?? '').split(';')[0]!.trim().toLowerCase();

/** A 401 carries the challenge that says how to authenticate, in either binding. */
export function challengeIfUnauthenticated(reply: FastifyReply, error: A2AError): void {
  if (error.httpStatus === 401) reply.header('www-authenticate', 'Bearer realm="keel"');
}

/** A parse of zod params into the service's input, or an invalid-params error naming each field. */
export function parseParams<S extends z.ZodTypeAny>(schema: S, value: unknown): Result<z.output<S>> {
  if (nestsDeeperThan(value, MAX_JSON_DEPTH)) return { ok: false, error: invalidParams([{ path: [], message: `nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels` }]) };
  const parsed = schema.safeParse(withJsonNames(value ?? {}));
  return parsed.success ? { ok: true, value: parsed.data } : { ok: false, error: invalidParams(parsed.error.issues) };
}

/** Sends a task's stream items as SSE events, each framed the binding's way, until the stream or the client ends. */
export async function streamToSse(
  logger: KeelLogger,
  request: FastifyRequest,
  reply: FastifyReply,
  items: (signal: AbortSignal) => AsyncGenerator<StreamItem>,
  frame: (item: StreamItem) => unknown,
  activated: string[],
): Promise<void> {
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
