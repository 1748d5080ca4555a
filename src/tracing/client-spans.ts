import { SpanKind, SpanStatusCode, type Context, type Span } from '@opentelemetry/api';
import { inSpan } from './keel-tracer.js';
import { incomingContext, injectTraceHeaders } from './trace-context.js';

// The CLIENT spans of Keel's outgoing requests: a push delivery attempt and a call to a remote A2A
// agent. Each injects its own span's traceparent into the request's headers. A destination is
// named by its host (and port) only: never its path, its query or a credential.

/** A URL's host and port, or null when it does not parse. */
function serverOf(url: string): { host: string; port: number | null } | null {
  try {
    const parsed = new URL(url);
    return { host: parsed.hostname, port: parsed.port === '' ? null : Number(parsed.port) };
  } catch {
    return null;
  }
}

/** What a push attempt's span records once it was answered. */
export type PushAttemptResult = { outcome: string; status: number | null };

/** One push delivery attempt: a CLIENT span `push.deliver` under the task's run span, its traceparent sent with the webhook. */
export function inPushDeliverySpan<T>(
  parent: Context,
  target: { url: string; deliveryId: string; taskId: string; attempt: number },
  headers: Record<string, string>,
  send: () => Promise<T>,
  describe: (result: T) => PushAttemptResult,
): Promise<T> {
  const server = serverOf(target.url);
  return inSpan(
    'push.deliver',
    {
      kind: SpanKind.CLIENT,
      attributes: {
        'http.request.method': 'POST',
        ...(server ? { 'server.address': server.host, ...(server.port === null ? {} : { 'server.port': server.port }) } : {}),
        'keel.task.id': target.taskId,
        'keel.push.delivery.id': target.deliveryId,
        'keel.push.attempt': target.attempt,
      },
    },
    parent,
    async (span) => {
      injectTraceHeaders(headers);
      const result = await send();
      const described = describe(result);
      span.setAttribute('keel.push.outcome', described.outcome);
      if (described.status !== null) span.setAttribute('http.response.status_code', described.status);
      if (described.outcome !== 'delivered') span.setStatus({ code: SpanStatusCode.ERROR, message: described.outcome });
      return result;
    },
  );
}

/** A call to a remote A2A agent: a CLIENT span `A2A <Method>` under the active span, its traceparent sent with the request. */
export function inRemoteCallSpan<T>(target: { url: string; method: string; remoteAgent: string }, headers: Record<string, string>, call: () => Promise<T>): Promise<T> {
  const server = serverOf(target.url);
  return inSpan(
    `A2A ${target.method}`,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        'rpc.system': 'a2a',
        'rpc.method': target.method,
        'keel.remote.agent': target.remoteAgent,
        ...(server ? { 'server.address': server.host, ...(server.port === null ? {} : { 'server.port': server.port }) } : {}),
      },
    },
    undefined,
    async () => {
      injectTraceHeaders(headers);
      return call();
    },
  );
}

/**
 * A remote agent's push to Keel's inbox: a SERVER span `keel.inbox.callback`, a child of the
 * pushing agent's traceparent when it sent one. Its answer's status is recorded when it is sent.
 */
export function inInboxCallbackSpan<T>(traceparent: string | undefined, tracestate: string | undefined, registrationId: string, receive: (span: Span) => Promise<T>): Promise<T> {
  return inSpan(
    'keel.inbox.callback',
    { kind: SpanKind.SERVER, attributes: { 'http.request.method': 'POST', 'http.route': '/a2a/inbox/:registrationId', 'keel.inbox.registration.id': registrationId } },
    incomingContext(traceparent, tracestate),
    receive,
  );
}
