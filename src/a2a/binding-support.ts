import { Readable } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import type { RequestAdmission } from '../limits/client-limits.js';
import type { KeelLogger } from '../log/logger.js';
import { MAX_JSON_DEPTH, nestsDeeperThan } from '../protocol/wire.js';
import { invalidParams, type A2AError, type Result } from './a2a-error.js';
import type { A2AService, Caller, StreamItem, StreamOptions } from './a2a-service.js';
import { withJsonNames } from './proto-json.js';
import { openSse, type SsePiece } from './sse.js';
import { eventJson, WRITE_SLICE_BYTES, type StreamFlow } from './stream-flow.js';

// What the JSON-RPC and the HTTP+JSON bindings share: the request's checks (run by a2a-routes.ts,
// handed to each binding), media types, the params parse and the SSE stream of a task.

export const A2A_JSON = 'application/a2a+json';
/** Both JSON media types are read; JSON-RPC and HTTP+JSON answer in this one (specification 9.1, 11.1). */
export const RESPONSE_JSON = 'application/json';
export const JSON_TYPES = new Set([RESPONSE_JSON, A2A_JSON]);

/**
 * The outcome of the checks every A2A request passes before its params are read. An admitted
 * request holds a slot of its client's limits (src/limits/) until it ends or becomes a stream.
 */
export type Gate = { ok: true; caller: Caller; activated: string[]; admission: RequestAdmission<A2AError> } | { ok: false; error: A2AError };

/**
 * Checks a request to an agent: the agent exists, the client is authenticated and within its
 * limits, the version and extensions. The request slot is given back when the reply closes.
 */
export type RequestGate = (request: FastifyRequest, reply: FastifyReply, agentId: string) => Promise<Gate>;

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

/** A refusal that names a wait (a per-client limit) says it in `Retry-After` too, in either binding. */
export function retryAfterHeader(reply: FastifyReply, error: A2AError): void {
  if (error.retryAfterSeconds !== undefined) reply.header('retry-after', String(error.retryAfterSeconds));
}

/**
 * Runs a streaming operation holding one of the client's open-stream slots, taken before the
 * operation starts (so a refused SendStreamingMessage creates no task) and freed when it returns
 * (the stream ended, or the operation answered with an error instead) or when the client's
 * connection closes, whichever comes first: a client that went away holds no slot while the
 * operation winds down.
 */
export async function holdingStreamSlot<T>(admission: RequestAdmission<A2AError>, refuse: (error: A2AError) => T, operation: () => Promise<T>, connection: FastifyReply['raw']): Promise<T> {
  const slot = admission.openStream();
  if (!slot.ok) return refuse(slot.error);
  if (connection.destroyed) slot.close();
  else connection.once('close', slot.close);
  try {
    return await operation();
  } finally {
    slot.close();
    connection.off('close', slot.close);
  }
}

/** A parse of zod params into the service's input, or an invalid-params error naming each field. */
export function parseParams<S extends z.ZodTypeAny>(schema: S, value: unknown): Result<z.output<S>> {
  if (nestsDeeperThan(value, MAX_JSON_DEPTH)) return { ok: false, error: invalidParams([{ path: [], message: `nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels` }]) };
  const parsed = schema.safeParse(withJsonNames(value ?? {}));
  return parsed.success ? { ok: true, value: parsed.data } : { ok: false, error: invalidParams(parsed.error.issues) };
}

/**
 * A shared JSON answer (a GetTask) as a body stream of slices of its buffers, paced with the
 * streams' writes (StreamFlow.pace): a hundred concurrent answers of a large task take turns with
 * the event loop's other work instead of one long run of copies into the kernel. Never copied.
 */
export function pacedBody(reply: FastifyReply, flow: StreamFlow, pieces: readonly Buffer[]): FastifyReply {
  const length = pieces.reduce((sum, piece) => sum + piece.length, 0);
  // A small answer goes at once (a copy of a few kilobytes costs less than a body stream).
  if (length <= WRITE_SLICE_BYTES) return reply.send(pieces.length === 1 ? pieces[0] : Buffer.concat(pieces, length));
  async function* slices() {
    for (const piece of pieces) {
      for (let start = 0; start < piece.length; start += WRITE_SLICE_BYTES) {
        const slice = piece.subarray(start, start + WRITE_SLICE_BYTES);
        await flow.pace(slice.length);
        yield slice;
      }
    }
  }
  return reply.header('content-length', length).send(Readable.from(slices(), { objectMode: false }));
}

/**
 * SubscribeToTask's stream on every binding: the Task first, then the journal; after the resume
 * point when one was named, and then, for a caller of the sequenced-events extension, still the
 * Task first (a plain client's Last-Event-ID continues its SSE stream where it broke off).
 */
export function subscriptionOptions(caller: Caller, signal: AbortSignal, resumeAfter: number | undefined): StreamOptions {
  return { signal, withSnapshot: true, subscription: true, ...(resumeAfter !== undefined ? { lastEventId: resumeAfter, snapshotOnResume: caller.sequenced === true } : {}) };
}

/** A stream item's response as JSON pieces: a shared snapshot's encoded Task, or the event's JSON encoded once. */
export function responsePieces(item: StreamItem): SsePiece[] {
  return item.taskJson ? ['{"task":', item.taskJson, '}'] : [eventJson(item.response)];
}

/** Sends a task's stream items as SSE events, each framed the binding's way, until the stream or the client ends. */
export async function streamToSse(
  logger: KeelLogger,
  request: FastifyRequest,
  reply: FastifyReply,
  items: (signal: AbortSignal) => AsyncGenerator<StreamItem>,
  frame: (item: StreamItem) => readonly SsePiece[],
  activated: string[],
  flow: StreamFlow,
): Promise<void> {
  const sse = openSse(request, reply, activated.length ? { 'a2a-extensions': activated.join(', ') } : {}, { flow, logger, context: { url: request.url } });
  try {
    // The next item is read only once this one is written (or its client was cut off).
    for await (const item of items(sse.signal)) {
      if (!(await sse.send(item.id, frame(item)))) break;
    }
  } catch (error) {
    logger.warn({ err: error }, 'stream ended by an error');
  } finally {
    sse.close();
  }
}
