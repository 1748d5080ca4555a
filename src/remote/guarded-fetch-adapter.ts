import type { GuardedFetch } from '../net/guarded-fetch.js';
import { describeRefusal } from '../net/guarded-fetch.js';
import { inRemoteCallSpan } from '../tracing/client-spans.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';

/** HTTP+JSON operations by their path's end (after the interface URL), for a request that is not JSON-RPC. */
const REST_METHODS: ReadonlyArray<[RegExp, string, string?]> = [
  [/\/message:send$/, 'SendMessage'],
  [/\/message:stream$/, 'SendStreamingMessage'],
  [/\/tasks\/[^/]+:cancel$/, 'CancelTask'],
  [/\/tasks\/[^/]+:subscribe$/, 'SubscribeToTask'],
  [/\/tasks\/[^/]+\/pushNotificationConfigs$/, 'CreateTaskPushNotificationConfig', 'POST'],
  [/\/tasks\/[^/]+\/pushNotificationConfigs$/, 'ListTaskPushNotificationConfigs', 'GET'],
  [/\/tasks\/[^/]+$/, 'GetTask', 'GET'],
  [/\/extendedAgentCard$/, 'GetExtendedAgentCard'],
  [/\/agent-card\.json$/, 'GetAgentCard'],
];

/** The A2A method a request to a remote agent calls: a JSON-RPC body's `method`, else the HTTP+JSON operation its path names. */
export function a2aMethodOf(httpMethod: string, url: string, body: Uint8Array | undefined): string {
  if (body && httpMethod === 'POST') {
    try {
      const parsed = JSON.parse(Buffer.from(body).toString('utf8')) as unknown;
      const method = typeof parsed === 'object' && parsed !== null ? (parsed as Record<string, unknown>)['method'] : undefined;
      if (typeof method === 'string' && /^[A-Za-z]{1,64}$/.test(method)) return method;
    } catch {
      // Not JSON: an HTTP+JSON request, named by its path below.
    }
  }
  const path = url.split('?')[0]!;
  const found = REST_METHODS.find(([pattern, , verb]) => pattern.test(path) && (verb === undefined || verb === httpMethod));
  return found ? found[1] : httpMethod;
}

/**
 * A `fetch` for the official A2A client that goes through Keel's address guard: no request to a
 * remote agent bypasses it (refused ranges, pinned DNS, no redirects). Extra headers (the remote
 * agent's credential) are added to every request.
 */
export function guardedFetchFor(fetch: GuardedFetch, extraHeaders: Record<string, string> = {}, timeoutMs = 30_000, remoteAgent = ''): typeof globalThis.fetch {
  return async (input, init) => {
    const request = input instanceof Request ? input : new Request(input, init);
    const headers: Record<string, string> = {};
    request.headers.forEach((value, key) => (headers[key] = value));
    Object.assign(headers, extraHeaders);
    const body = request.body ? new Uint8Array(await request.arrayBuffer()) : undefined;
    const send = () =>
      fetch({
        url: request.url,
        method: request.method as 'GET' | 'POST',
        headers,
        ...(body ? { body } : {}),
        timeoutMs,
        ...(init?.signal ? { signal: init.signal } : {}),
      });
    // While tracing is on, each request is a CLIENT span whose traceparent the remote Keel continues.
    const result = tracingEnabled() ? await inRemoteCallSpan({ url: request.url, method: a2aMethodOf(request.method, request.url, body), remoteAgent }, headers, send) : await send();
    if (!result.ok) {
      throw new TypeError(result.kind === 'refused' ? `refused by the address guard: ${describeRefusal(result.refusal)}` : `request failed (${result.failure.class}): ${result.failure.message}`);
    }
    const { response } = result;
    return new Response(response.status === 204 || response.status === 304 ? null : new Uint8Array(response.body), {
      status: response.status,
      headers: response.headers,
    });
  };
}
