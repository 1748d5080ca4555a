import type { GuardedFetch } from '../net/guarded-fetch.js';
import { describeRefusal } from '../net/guarded-fetch.js';

/**
 * A `fetch` for the official A2A client that goes through Keel's address guard: no request to a
 * remote agent bypasses it (refused ranges, pinned DNS, no redirects). Extra headers (the remote
 * agent's credential) are added to every request.
 */
export function guardedFetchFor(fetch: GuardedFetch, extraHeaders: Record<string, string> = {}, timeoutMs = 30_000): typeof globalThis.fetch {
  return async (input, init) => {
    const request = input instanceof Request ? input : new Request(input, init);
    const headers: Record<string, string> = {};
    request.headers.forEach((value, key) => (headers[key] = value));
    Object.assign(headers, extraHeaders);
    const body = request.body ? new Uint8Array(await request.arrayBuffer()) : undefined;
    const result = await fetch({
      url: request.url,
      method: request.method as 'GET' | 'POST',
      headers,
      ...(body ? { body } : {}),
      timeoutMs,
      ...(init?.signal ? { signal: init.signal } : {}),
    });
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
