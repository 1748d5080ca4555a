import { SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { inSpan } from './keel-tracer.js';
import { incomingContext } from './trace-context.js';
import { tracingEnabled } from './tracing-switch.js';

// The SERVER span of an A2A request, on each binding: `A2A <Method>`, a child of the caller's
// traceparent when it sent a valid one (HTTP headers, gRPC metadata), else the root of a new trace.

export type A2ABinding = 'jsonrpc' | 'rest' | 'grpc';

/** What the span says of a request that passed the gate. */
export type A2ARequestTrace = {
  binding: A2ABinding;
  /** The A2A 1.0 method name, e.g. SendMessage. */
  method: string;
  agentId: string;
  clientId: string;
  traceparent: string | undefined;
  tracestate: string | undefined;
  /** The task the request names, when its params name one (SendMessage's is noted once accepted). */
  taskId?: string | undefined;
};

/** Runs the request's work inside its SERVER span; the work alone while tracing is off. */
export function inA2AServerSpan<T>(request: A2ARequestTrace, work: () => Promise<T>): Promise<T> {
  if (!tracingEnabled()) return work();
  return inSpan(
    `A2A ${request.method}`,
    {
      kind: SpanKind.SERVER,
      attributes: {
        'rpc.system': 'a2a',
        'rpc.method': request.method,
        'rpc.service': 'a2a.v1.A2AService',
        'keel.a2a.binding': request.binding,
        'gen_ai.agent.id': request.agentId,
        'keel.client.id': request.clientId,
        ...(request.taskId ? { 'keel.task.id': request.taskId } : {}),
      },
    },
    incomingContext(request.traceparent, request.tracestate),
    () => work(),
  );
}

/** Names the task a request created or continued on its SERVER span (the active span). */
export function noteTaskId(taskId: string): void {
  if (!tracingEnabled()) return;
  trace.getActiveSpan()?.setAttribute('keel.task.id', taskId);
}

/** The task id a request's params name (`id` or `taskId`, a string), for its span. */
export function taskIdOfParams(params: unknown): string | undefined {
  if (typeof params !== 'object' || params === null) return undefined;
  const record = params as Record<string, unknown>;
  const value = typeof record['taskId'] === 'string' ? record['taskId'] : record['id'];
  return typeof value === 'string' ? value : undefined;
}

/**
 * Marks the active SERVER span with the A2A error its request was answered with: `error.type` (the
 * error's reason, e.g. TASK_NOT_FOUND), its JSON-RPC code and HTTP status. As OpenTelemetry's
 * conventions have it for server spans, only an error that is the server's fault (HTTP 5xx) sets
 * the ERROR status; a refused request (4xx) stays unset but says why. Never the message, which may
 * quote what the client sent.
 */
export function noteA2AError(error: { reason: string; code: number; httpStatus: number }): void {
  if (!tracingEnabled()) return;
  const span = trace.getActiveSpan();
  if (!span) return;
  span.setAttributes({ 'error.type': error.reason, 'rpc.jsonrpc.error_code': error.code, 'http.response.status_code': error.httpStatus });
  if (error.httpStatus >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: error.reason });
}
