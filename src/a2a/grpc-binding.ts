import { once } from 'node:events';
import http2 from 'node:http2';
import { format } from 'node:util';
import {
  AgentCard,
  CancelTaskRequest,
  DeleteTaskPushNotificationConfigRequest,
  GetExtendedAgentCardRequest,
  GetTaskPushNotificationConfigRequest,
  GetTaskRequest,
  ListTaskPushNotificationConfigsRequest,
  ListTaskPushNotificationConfigsResponse,
  ListTasksRequest,
  ListTasksResponse,
  SendMessageRequest,
  SendMessageResponse,
  StreamResponse,
  SubscribeToTaskRequest,
  Task,
  TaskPushNotificationConfig,
} from '@a2a-js/sdk';
import { A2AService as A2AServiceDefinition } from '@a2a-js/sdk/server/grpc';
import {
  Metadata,
  Server,
  ServerCredentials,
  setLogger,
  type sendUnaryData,
  type ServerUnaryCall,
  type ServerWritableStream,
  type ServiceDefinition,
  type UntypedServiceImplementation,
} from '@grpc/grpc-js';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { ClientAuthenticator } from '../auth/client-authenticator.js';
import type { ClientLimits, RequestAdmission } from '../limits/client-limits.js';
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
  type StreamResponse as WireStreamResponse,
} from '../protocol/wire.js';
import { A2AErrors, invalidParams, ok, type A2AError, type Result } from './a2a-error.js';
import { createServiceGate } from './a2a-routes.js';
import type { A2AService, Caller, SendOptions, StreamItem } from './a2a-service.js';
import { hostPort } from './agent-card.js';
import { parseParams, subscriptionOptions } from './binding-support.js';
import { grpcErrorStatus } from './grpc-status.js';
import { inA2AServerSpan, noteA2AError, taskIdOfParams, type A2ARequestTrace } from '../tracing/a2a-server-span.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';

// The gRPC binding (specification 10; decision 0020): every method of lf.a2a.v1.A2AService on a
// port of its own, over the same service and the same gate as the HTTP bindings. The service
// definition (method paths and protobuf codecs) is the official SDK's generated one; each request
// is turned into its ProtoJSON form with the SDK's generated types and read by the same params
// schemas as JSON-RPC, and each answer is Keel's JSON turned back into the proto message.
//
// - Service parameters are metadata (10.2): `authorization`, `a2a-version`, `a2a-extensions`;
//   the activated extensions are echoed in the response's initial metadata `a2a-extensions`.
// - One port serves every agent: a request's `tenant` names the agent (each card's GRPC interface
//   carries it), an empty one the first configured agent.
// - Streams are the journal, as over SSE. gRPC has no per-message headers, so the SSE `id:` of each
//   status and artifact update travels in the update's own metadata under EVENT_ID_KEY; a client
//   that lost its stream resumes with SubscribeToTask and that value as `last-event-id` metadata.

/** The key of a stream update's metadata that holds its journal sequence (the SSE event id). */
export const EVENT_ID_KEY = 'keel.eventId';
/** Request metadata: resume a SubscribeToTask after this journal sequence (the SSE Last-Event-ID). */
export const LAST_EVENT_ID = 'last-event-id';
export const EXTENSIONS_KEY = 'a2a-extensions';

/** One gRPC call that passed the gate, its request in ProtoJSON form. */
export type GrpcCall = {
  caller: Caller;
  activated: string[];
  service: A2AService;
  metadata: Metadata;
  logger: KeelLogger;
};

type StreamOpener = (signal: AbortSignal) => AsyncGenerator<StreamItem>;
export type GrpcUnaryHandler = (call: GrpcCall, params: unknown) => Promise<Result<unknown>>;
/** A stream handler refuses before the stream starts (a plain status) or returns the stream to send. */
export type GrpcStreamHandler = (call: GrpcCall, params: unknown) => Promise<Result<StreamOpener>>;

// The SDK's generated codecs between the proto messages and their ProtoJSON form.
type ToJson = { toJSON(message: never): unknown };
type FromJson = { fromJSON(object: unknown): unknown };

export type GrpcMethod =
  | { kind: 'unary'; request: ToJson; response: FromJson; handle: GrpcUnaryHandler }
  | { kind: 'stream'; request: ToJson; handle: GrpcStreamHandler };

const EMPTY: FromJson = { fromJSON: () => ({}) };

/** Texts of a metadata key (gRPC lowercases keys; a `-bin` key's value is bytes). */
function metadataTexts(metadata: Metadata, key: string): string[] {
  return metadata.get(key).map((value) => (typeof value === 'string' ? value : value.toString('utf8')));
}

function lastEventIdOf(metadata: Metadata): number | undefined {
  const value = metadataTexts(metadata, LAST_EVENT_ID)[0]?.trim();
  return value !== undefined && /^\d{1,9}$/.test(value) ? Number(value) : undefined;
}

/** The `idempotency-key` metadata entry, the key a client may name its message by instead of the messageId (decision 0064). */
function idempotencyKeyOf(metadata: Metadata): SendOptions {
  return { idempotencyKey: metadataTexts(metadata, 'idempotency-key')[0] };
}

export async function handleSendMessage(call: GrpcCall, params: unknown) {
  const input = parseParams(sendMessageParamsSchema, params);
  return input.ok ? call.service.sendMessage(call.caller, input.value, idempotencyKeyOf(call.metadata)) : input;
}

export async function handleSendStreamingMessage(call: GrpcCall, params: unknown): Promise<Result<StreamOpener>> {
  const { service, caller } = call;
  const input = parseParams(sendMessageParamsSchema, params);
  if (!input.ok) return input;
  const accepted = await service.acceptMessage(caller, input.value, undefined, idempotencyKeyOf(call.metadata));
  if (!accepted.ok) return accepted;
  const { taskId, afterSequence } = accepted.value;
  const continuing = input.value.message.taskId !== undefined;
  return ok((signal: AbortSignal) => service.stream(caller, taskId, { signal, withSnapshot: true, ...(continuing ? { lastEventId: afterSequence } : { fromCreation: true }) }));
}

export async function handleGetTask(call: GrpcCall, params: unknown) {
  const input = parseParams(getTaskParamsSchema, params);
  return input.ok ? call.service.getTask(call.caller, input.value.id, input.value.historyLength) : input;
}

export async function handleListTasks(call: GrpcCall, params: unknown) {
  const input = parseParams(listTasksParamsSchema, params);
  return input.ok ? call.service.listTasks(call.caller, input.value) : input;
}

export async function handleCancelTask(call: GrpcCall, params: unknown) {
  const input = parseParams(cancelTaskParamsSchema, params);
  return input.ok ? call.service.cancelTask(call.caller, input.value.id) : input;
}

export async function handleSubscribeToTask(call: GrpcCall, params: unknown): Promise<Result<StreamOpener>> {
  const { service, caller } = call;
  const input = parseParams(subscribeParamsSchema, params);
  if (!input.ok) return input;
  // SubscribeToTaskRequest has no metadata field: the resume point is the call's `last-event-id` entry.
  const resumeAfter = lastEventIdOf(call.metadata);
  const check = await service.checkSubscribable(caller, input.value.id, resumeAfter);
  if (!check.ok) return check;
  return ok((signal: AbortSignal) => service.stream(caller, input.value.id, subscriptionOptions(caller, signal, resumeAfter)));
}

export async function handleCreateTaskPushNotificationConfig(call: GrpcCall, params: unknown) {
  const input = parseParams(createPushConfigParamsSchema, params);
  return input.ok ? call.service.createPushConfig(call.caller, input.value) : input;
}

export async function handleGetTaskPushNotificationConfig(call: GrpcCall, params: unknown) {
  const input = parseParams(getPushConfigParamsSchema, params);
  return input.ok ? call.service.getPushConfig(call.caller, input.value.taskId, input.value.id) : input;
}

export async function handleListTaskPushNotificationConfigs(call: GrpcCall, params: unknown) {
  const input = parseParams(listPushConfigsParamsSchema, params);
  return input.ok ? call.service.listPushConfigs(call.caller, input.value.taskId, input.value.pageSize, input.value.pageToken) : input;
}

export async function handleDeleteTaskPushNotificationConfig(call: GrpcCall, params: unknown) {
  const input = parseParams(deletePushConfigParamsSchema, params);
  return input.ok ? call.service.deletePushConfig(call.caller, input.value.taskId, input.value.id) : input;
}

export async function handleGetExtendedAgentCard(call: GrpcCall, params: unknown) {
  const input = parseParams(extendedCardParamsSchema, params);
  return input.ok ? call.service.extendedCard(call.caller) : input;
}

/** The methods of lf.a2a.v1.A2AService by the keys of its service definition. */
export const grpcMethods: Readonly<Record<keyof typeof A2AServiceDefinition, GrpcMethod>> = {
  sendMessage: { kind: 'unary', request: SendMessageRequest, response: SendMessageResponse, handle: handleSendMessage },
  sendStreamingMessage: { kind: 'stream', request: SendMessageRequest, handle: handleSendStreamingMessage },
  getTask: { kind: 'unary', request: GetTaskRequest, response: Task, handle: handleGetTask },
  listTasks: { kind: 'unary', request: ListTasksRequest, response: ListTasksResponse, handle: handleListTasks },
  cancelTask: { kind: 'unary', request: CancelTaskRequest, response: Task, handle: handleCancelTask },
  subscribeToTask: { kind: 'stream', request: SubscribeToTaskRequest, handle: handleSubscribeToTask },
  createTaskPushNotificationConfig: {
    kind: 'unary',
    request: TaskPushNotificationConfig,
    response: TaskPushNotificationConfig,
    handle: handleCreateTaskPushNotificationConfig,
  },
  getTaskPushNotificationConfig: {
    kind: 'unary',
    request: GetTaskPushNotificationConfigRequest,
    response: TaskPushNotificationConfig,
    handle: handleGetTaskPushNotificationConfig,
  },
  listTaskPushNotificationConfigs: {
    kind: 'unary',
    request: ListTaskPushNotificationConfigsRequest,
    response: ListTaskPushNotificationConfigsResponse,
    handle: handleListTaskPushNotificationConfigs,
  },
  deleteTaskPushNotificationConfig: { kind: 'unary', request: DeleteTaskPushNotificationConfigRequest, response: EMPTY, handle: handleDeleteTaskPushNotificationConfig },
  getExtendedAgentCard: { kind: 'unary', request: GetExtendedAgentCardRequest, response: AgentCard, handle: handleGetExtendedAgentCard },
};

/** A request whose bytes are not the method's message: held as a value so it gets INVALID_ARGUMENT, not grpc-js's INTERNAL. */
class MalformedRequest {
  constructor(readonly reason: string) {}
}

/**
 * The SDK's service definition with a decoder that never throws: grpc-js answers a decoding error
 * with INTERNAL, but bytes that are not the request message are the client's mistake.
 */
function tolerantDefinition(): ServiceDefinition {
  return Object.fromEntries(
    Object.entries(A2AServiceDefinition).map(([name, method]) => [
      name,
      {
        ...method,
        requestDeserialize: (bytes: Buffer) => {
          try {
            return (method.requestDeserialize as (value: Buffer) => unknown)(bytes);
          } catch (error) {
            return new MalformedRequest((error as Error).message);
          }
        },
      },
    ]),
  ) as ServiceDefinition;
}

/** A journal item as the proto StreamResponse, an update carrying its sequence in its metadata. */
export function streamFrame(item: StreamItem): unknown {
  const response: WireStreamResponse = item.response;
  const stamped =
    'statusUpdate' in response
      ? { statusUpdate: { ...response.statusUpdate, metadata: { ...response.statusUpdate.metadata, [EVENT_ID_KEY]: item.id } } }
      : 'artifactUpdate' in response
        ? { artifactUpdate: { ...response.artifactUpdate, metadata: { ...response.artifactUpdate.metadata, [EVENT_ID_KEY]: item.id } } }
        : response;
  return StreamResponse.fromJSON(stamped);
}

/** Writes one message; true once grpc-js has sent it, false when it was not sent within `timeoutMs` or the call is gone. */
async function sentWithin(call: ServerWritableStream<unknown, unknown>, message: unknown, timeoutMs: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return false;
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), timeoutMs);
  const sent = new Promise<boolean>((resolve) => {
    call.write(message, (error: Error | null | undefined) => resolve(!error));
  });
  try {
    return await Promise.race([sent, once(signal, 'abort', { signal: stop.signal }).then(() => false), once(stop.signal, 'abort').then(() => false)]);
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
    stop.abort();
  }
}

/**
 * Ends a stream whose client does not read with an HTTP/2 RST_STREAM (CANCEL): a status would wait
 * behind the message the client does not take. grpc-js gives the server call no public reset, so
 * its HTTP/2 stream is found through the call chain (the innermost call holds it).
 */
function resetStream(call: ServerWritableStream<unknown, unknown>): void {
  let link = (call as unknown as { call?: unknown }).call as { stream?: { close?: (code: number) => void }; nextCall?: unknown } | undefined;
  for (let depth = 0; link && !link.stream && depth < 8; depth += 1) link = link.nextCall as typeof link;
  if (link?.stream?.close) link.stream.close(http2.constants.NGHTTP2_CANCEL);
  else call.destroy();
}

export type GrpcBindingDeps = {
  service: A2AService;
  registry: AgentRegistry;
  authenticator: ClientAuthenticator;
  logger: KeelLogger;
  limits: ClientLimits<A2AError>;
};

type Admitted = { ok: true; call: GrpcCall; params: unknown; echo: Metadata; admission: RequestAdmission<A2AError> } | { ok: false; error: A2AError; echo?: Metadata };

/** The SERVER span's view of an admitted gRPC call: the method from the call's path (`/<service>/<Method>`), the trace context from its metadata. */
function grpcRequestTrace(call: ServerUnaryCall<unknown, unknown> | ServerWritableStream<unknown, unknown>, admitted: Extract<Admitted, { ok: true }>): A2ARequestTrace {
  const path = call.getPath();
  return {
    binding: 'grpc',
    method: path.slice(path.lastIndexOf('/') + 1),
    agentId: admitted.call.caller.agent.config.id,
    clientId: admitted.call.caller.clientId,
    traceparent: metadataTexts(admitted.call.metadata, 'traceparent')[0],
    tracestate: metadataTexts(admitted.call.metadata, 'tracestate')[0],
    taskId: taskIdOfParams(admitted.params),
  };
}

/** The service implementation: each method's call through the gate, its handler and back to proto. */
export function createGrpcImplementation(deps: GrpcBindingDeps): UntypedServiceImplementation {
  const { service, registry, logger } = deps;
  const gate = createServiceGate(registry, deps.authenticator, deps.limits);

  const admit = async (method: GrpcMethod, request: unknown, metadata: Metadata): Promise<Admitted> => {
    const malformed = request instanceof MalformedRequest;
    const tenant = !malformed && typeof (request as { tenant?: unknown }).tenant === 'string' ? (request as { tenant: string }).tenant : '';
    // A request that could not be read is checked against the default agent, so the caller is
    // authenticated (and learns nothing more) before it hears about its bytes.
    const guard = await gate({
      agentId: tenant || registry.defaultAgentId,
      authorization: metadataTexts(metadata, 'authorization')[0],
      version: metadataTexts(metadata, 'a2a-version')[0],
      extensions: metadataTexts(metadata, EXTENSIONS_KEY).join(',') || undefined,
    });
    if (!guard.ok) return guard;
    const echo = new Metadata();
    if (guard.activated.length) echo.set(EXTENSIONS_KEY, guard.activated.join(', '));
    if (malformed) {
      guard.admission.release();
      return { ok: false, error: invalidParams([{ path: [], message: `the request is not a valid protobuf message: ${request.reason}` }]), echo };
    }
    let params: unknown;
    try {
      params = method.request.toJSON(request as never);
    } catch (error) {
      guard.admission.release();
      throw error;
    }
    return { ok: true, call: { caller: guard.caller, activated: guard.activated, service, metadata, logger }, params, echo, admission: guard.admission };
  };

  const internal = (error: unknown, path: string) => {
    logger.error({ err: error, method: path }, 'gRPC call failed');
    return grpcErrorStatus(A2AErrors.internal('internal error'));
  };

  const unary = (method: Extract<GrpcMethod, { kind: 'unary' }>) => async (call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) => {
    let admission: RequestAdmission<A2AError> | null = null;
    try {
      const admitted = await admit(method, call.request, call.metadata);
      if (admitted.echo) call.sendMetadata(admitted.echo);
      if (!admitted.ok) return callback(grpcErrorStatus(admitted.error));
      admission = admitted.admission;
      const handle = () => method.handle(admitted.call, admitted.params);
      const result = tracingEnabled()
        ? await inA2AServerSpan(grpcRequestTrace(call, admitted), async () => {
            const answered = await handle();
            if (!answered.ok) noteA2AError(answered.error);
            return answered;
          })
        : await handle();
      if (!result.ok) return callback(grpcErrorStatus(result.error));
      callback(null, method.response.fromJSON(result.value));
    } catch (error) {
      callback(internal(error, call.getPath()));
    } finally {
      admission?.release();
    }
  };

  const stream = (method: Extract<GrpcMethod, { kind: 'stream' }>) => async (call: ServerWritableStream<unknown, unknown>) => {
    const abort = new AbortController();
    // One of the client's open-stream slots, from before the handler runs (a refused
    // SendStreamingMessage creates no task) until the call ends or the client cancels it.
    let streamSlot: { close: () => void } | null = null;
    const onCancel = () => {
      abort.abort();
      streamSlot?.close();
    };
    call.on('cancelled', onCancel);
    try {
      const admitted = await admit(method, call.request, call.metadata);
      if (admitted.echo) call.sendMetadata(admitted.echo);
      if (!admitted.ok) return void call.emit('error', grpcErrorStatus(admitted.error));
      const slot = admitted.admission.openStream();
      if (!slot.ok) {
        admitted.admission.release();
        return void call.emit('error', grpcErrorStatus(slot.error));
      }
      streamSlot = slot;
      const serve = () => serveStream(method, admitted, call, abort.signal);
      await (tracingEnabled() ? inA2AServerSpan(grpcRequestTrace(call, admitted), serve) : serve());
    } catch (error) {
      if (!call.cancelled) call.emit('error', internal(error, call.getPath()));
    } finally {
      streamSlot?.close();
      call.off('cancelled', onCancel);
    }
  };

  /** A stream method's handler, then its items sent one at a time until it ends, the client cancels or stalls. */
  const serveStream = async (method: Extract<GrpcMethod, { kind: 'stream' }>, admitted: Extract<Admitted, { ok: true }>, call: ServerWritableStream<unknown, unknown>, signal: AbortSignal) => {
    const abort = { signal };
    {
      const opened = await method.handle(admitted.call, admitted.params);
      if (!opened.ok) {
        noteA2AError(opened.error);
        return void call.emit('error', grpcErrorStatus(opened.error));
      }
      try {
        for await (const item of opened.value(abort.signal)) {
          if (call.cancelled) break;
          // Backpressure: one message in flight per stream (a message cannot be sliced as an SSE
          // event is), the next journal event read once it is sent; a client that takes nothing
          // for a2a.streams.stallTimeoutSeconds is cut off. A slow reader holds the journal cursor,
          // not a growing buffer.
          if (!(await sentWithin(call, streamFrame(item), service.streamFlow.limits.stallTimeoutMs, abort.signal))) {
            if (!call.cancelled && !abort.signal.aborted) {
              service.streamFlow.cutOff('grpc', 'stalled', logger, { method: call.getPath() });
              resetStream(call);
            }
            return;
          }
        }
      } catch (error) {
        // As over SSE: events already sent stand; the client resumes from the last id it saw.
        logger.warn({ err: error, method: call.getPath() }, 'stream ended by an error');
      }
      if (!call.cancelled) call.end();
    }
  };

  return Object.fromEntries(Object.entries(grpcMethods).map(([name, method]) => [name, method.kind === 'unary' ? unary(method) : stream(method)]));
}

/** Keel's gRPC server: the binding on its own port, stopped with the HTTP server (graceful, then forced). */
export class GrpcServer {
  readonly #server: Server;
  readonly #logger: KeelLogger;
  #closing: Promise<void> | null = null;

  constructor(deps: GrpcBindingDeps, options: { maxMessageBytes: number }) {
    this.#logger = deps.logger;
    // grpc-js writes its own diagnostics to stderr; they go to Keel's log instead (the logger is
    // process-wide in grpc-js: the last server built names it, and a process builds one).
    const grpcLog = deps.logger.child({ component: 'grpc' });
    setLogger({
      error: (message?: unknown, ...rest: unknown[]) => grpcLog.warn(format(message, ...rest)),
      info: (message?: unknown, ...rest: unknown[]) => grpcLog.info(format(message, ...rest)),
      debug: (message?: unknown, ...rest: unknown[]) => grpcLog.debug(format(message, ...rest)),
    });
    this.#server = new Server({
      // The same bound as an HTTP request body; a larger message is refused with RESOURCE_EXHAUSTED.
      'grpc.max_receive_message_length': options.maxMessageBytes,
      // Open streams may be idle for minutes: pings keep proxies from dropping them (as SSE's comment lines do).
      'grpc.keepalive_time_ms': 15_000,
      'grpc.keepalive_timeout_ms': 10_000,
    });
    this.#server.addService(tolerantDefinition(), createGrpcImplementation(deps));
  }

  /** Binds `host:port` (plaintext: TLS is the fronting proxy's, as for HTTP) and returns the port bound. */
  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      this.#server.bindAsync(hostPort(host, port), ServerCredentials.createInsecure(), (error, bound) => (error ? reject(error) : resolve(bound)));
    });
  }

  /**
   * Stops taking calls (new ones are refused, so clients go elsewhere); resolves when the calls in
   * flight have ended. Streams end when the service's shutdown signal fires, after what is committed.
   */
  close(): Promise<void> {
    this.#closing ??= new Promise<void>((resolve) => {
      this.#server.tryShutdown((error) => {
        if (error) this.#logger.warn({ err: error }, 'gRPC server did not shut down cleanly');
        resolve();
      });
    });
    return this.#closing;
  }

  /** Ends every call at once (UNAVAILABLE for the client): for calls still open past the grace. */
  forceClose(): void {
    this.#server.forceShutdown();
  }
}
