/**
 * The one guarded outbound HTTP entry point (docs/architecture.md, "Address guard"). Every outbound
 * request of Keel goes through `createGuardedFetch` (push deliveries, remote agent cards and
 * endpoints, the `http_get` tool, the `openai` provider), so the rules are kept in one place.
 *
 * `checkUrl` reports the first rule a URL breaks, the DNS lookup last so that a URL refused on its
 * text costs no resolution. Numeric host forms are judged on the raw text before the allowlist is
 * consulted: `allowHosts` lifts the range block for its exact literal, never the numeric-form rule
 * (host-forms.ts says why).
 *
 * The request is then sent over a connection pinned to a vetted address (see `PinnedDispatchers`),
 * redirects are never followed (a 3xx is an ordinary response), one deadline covers resolution,
 * connection, headers and body, and the body is read up to `maxResponseBytes`. The function never
 * throws: refusals and failures are typed values.
 */
import { lookup as dnsLookup } from 'node:dns/promises';
import type { LookupAddress, LookupOptions } from 'node:dns';
import type { LookupFunction } from 'node:net';
import { performance } from 'node:perf_hooks';
import { Agent } from 'undici';
import type { Dispatcher } from 'undici';
import { canonicalIp, ipFamily, isRefusedAddress } from './address-ranges.js';
import { classifyRawHost, extractRawHost, rawAuthorityHasUserinfo } from './host-forms.js';

export type GuardPolicy = { allowHosts: readonly string[]; allowHttp: boolean };

export type GuardRefusalReason =
  | 'invalid_url'
  | 'scheme'
  | 'numeric_host'
  | 'refused_range'
  | 'resolution_failed'
  | 'credentials_in_url';

/**
 * A refusal. `host` is the URL's host as WHATWG normalises it (IPv6 in brackets), except for
 * `numeric_host` where it is the raw text as written (`2130706433`), and `invalid_url` where it is
 * the raw host text if one could be found (else ''). Never carries the URL's userinfo, path or query.
 */
export type GuardRefusal = { reason: GuardRefusalReason; host: string; address?: string; range?: string; detail: string };

export type GuardedRequest = {
  url: string;
  method?: 'GET' | 'POST' | 'PUT' | 'DELETE' | 'PATCH' | 'HEAD';
  headers?: Record<string, string>;
  body?: string | Uint8Array;
  /** One deadline for resolution, connection, response headers and the whole body. */
  timeoutMs: number;
  /**
   * A shorter deadline for the TCP (and TLS) connection alone (undici's connect timeout), so a
   * destination that does not accept fails fast while one that accepts keeps `timeoutMs` to answer.
   * Default: `timeoutMs`.
   */
  connectTimeoutMs?: number;
  signal?: AbortSignal;
  /** Default 10 MiB. */
  maxResponseBytes?: number;
  /**
   * What a body over `maxResponseBytes` is: `fail` (default) a `too_large` failure; `truncate` an
   * answer whose body is the first `maxResponseBytes` bytes, the rest discarded unread (the
   * connection is closed), for a caller that needs only the status (a push acknowledgement).
   */
  overLimit?: 'fail' | 'truncate';
};

export type GuardedResponse = {
  status: number;
  /** Lowercase names; repeated headers joined with `, `. */
  headers: Record<string, string>;
  body: Buffer;
  durationMs: number;
  /** The vetted IP address the request was sent to. */
  address: string;
};

export type GuardedFailureClass = 'timeout' | 'connection' | 'aborted' | 'too_large' | 'protocol';

export type GuardedFetchResult =
  | { ok: true; response: GuardedResponse }
  | { ok: false; kind: 'refused'; refusal: GuardRefusal }
  | { ok: false; kind: 'failed'; failure: { class: GuardedFailureClass; message: string; durationMs: number } };

export type GuardedFetch = (request: GuardedRequest) => Promise<GuardedFetchResult>;

/** A guarded fetch that also owns its connection pools; `close()` ends them (tests, shutdown). */
export type ClosableGuardedFetch = GuardedFetch & { close(): Promise<void> };

/** Resolves a host name to IP literals. */
export type Resolver = (hostname: string) => Promise<string[]>;

export const DEFAULT_MAX_RESPONSE_BYTES = 10 * 1024 * 1024;

/** The default resolver: the system resolver (`/etc/hosts`, then DNS), every answer, in its order. */
export const defaultResolver: Resolver = async (hostname) => {
  const answers = await dnsLookup(hostname, { all: true, verbatim: true });
  return answers.map((a) => a.address);
};

// ---------------------------------------------------------------------------------------------
// checkUrl
// ---------------------------------------------------------------------------------------------

export type UrlCheck = { ok: true; host: string; addresses: string[] } | { ok: false; refusal: GuardRefusal };

/** An allowHosts entry as compared: lowercase, IPv6 without brackets and in canonical form. */
function normalizeAllowEntry(entry: string): string {
  let text = entry.trim().toLowerCase();
  if (text.startsWith('[') && text.endsWith(']')) text = text.slice(1, -1);
  if (text.includes(':')) return canonicalIp(text) ?? text;
  return text;
}

/** The URL hostname as compared with allowHosts and used for connecting: IPv6 without brackets. */
function bareHost(hostname: string): string {
  return hostname.startsWith('[') && hostname.endsWith(']') ? hostname.slice(1, -1) : hostname;
}

function isAllowlisted(policy: GuardPolicy, hostname: string): boolean {
  const bare = bareHost(hostname);
  return policy.allowHosts.some((entry) => normalizeAllowEntry(entry) === bare);
}

function refusal(reason: GuardRefusalReason, host: string, detail: string, extra: { address?: string; range?: string } = {}): {
  ok: false;
  refusal: GuardRefusal;
} {
  return { ok: false, refusal: { reason, host, ...extra, detail } };
}

function errorCode(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err && typeof err.code === 'string') return err.code;
  return undefined;
}

/**
 * Checks a URL against the policy and resolves its host (the rules: docs/architecture.md, "Address
 * guard"; the first one broken is reported). On success `host` is the WHATWG hostname (IPv6 in brackets) and `addresses` the
 * vetted IP literals (no brackets), in resolver order, without duplicates.
 */
export async function checkUrl(url: string, policy: GuardPolicy, resolver: Resolver = defaultResolver): Promise<UrlCheck> {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    const raw = extractRawHost(url);
    const form = raw === undefined ? undefined : classifyRawHost(raw);
    if (raw !== undefined && form?.kind === 'numeric') {
      // e.g. 1.2.3.4.5 or 0x100000000: numeric text WHATWG cannot even turn into an address.
      return refusal('numeric_host', raw, `${form.form}; only a canonical dotted quad is accepted`);
    }
    return refusal('invalid_url', raw ?? '', 'the URL cannot be parsed');
  }
  const hostname = parsed.hostname;

  if (parsed.protocol !== 'https:' && parsed.protocol !== 'http:') {
    return refusal('scheme', hostname, `the scheme ${parsed.protocol} is not allowed (only https, or http when allowHttp is set)`);
  }
  if (parsed.protocol === 'http:' && !policy.allowHttp) {
    return refusal('scheme', hostname, 'plain http is not allowed (allowHttp is false); use https');
  }
  if (parsed.username !== '' || parsed.password !== '' || rawAuthorityHasUserinfo(url)) {
    return refusal('credentials_in_url', hostname, 'the URL carries userinfo (user:password@); pass credentials in a header');
  }
  if (hostname === '') return refusal('invalid_url', '', 'the URL has no host');

  // Numeric forms: decided on the raw text, because WHATWG has already turned them into a quad.
  const family = ipFamily(bareHost(hostname));
  const rawHost = extractRawHost(url);
  if (family === 4) {
    const form = rawHost === undefined ? undefined : classifyRawHost(rawHost);
    if (form === undefined || form.kind !== 'ipv4' || form.address !== hostname) {
      const name = form?.kind === 'numeric' ? form.form : 'non-canonical';
      return refusal('numeric_host', rawHost ?? hostname, `${name} form of ${hostname}; only a canonical dotted quad is accepted`, {
        address: hostname,
      });
    }
  } else if (rawHost !== undefined) {
    const form = classifyRawHost(rawHost);
    // Cannot normally happen (WHATWG would have produced an IPv4 host); refuse if it ever does.
    if (form.kind === 'numeric') {
      return refusal('numeric_host', rawHost, `${form.form} numeric form`, form.address === undefined ? {} : { address: form.address });
    }
  }

  const allowlisted = isAllowlisted(policy, hostname);

  if (family !== 0) {
    const address = canonicalIp(bareHost(hostname)) ?? bareHost(hostname);
    if (!allowlisted) {
      const range = isRefusedAddress(address);
      if (range.refused) {
        return refusal('refused_range', hostname, `${address} is in the refused range ${range.range}`, { address, range: range.range });
      }
    }
    return { ok: true, host: hostname, addresses: [address] };
  }

  let answers: string[];
  try {
    answers = await resolver(hostname);
  } catch (err) {
    const code = errorCode(err);
    return refusal('resolution_failed', hostname, `the host name could not be resolved${code === undefined ? '' : ` (${code})`}`);
  }
  if (!Array.isArray(answers) || answers.length === 0) {
    return refusal('resolution_failed', hostname, 'the host name resolved to no address');
  }
  const addresses: string[] = [];
  for (const answer of answers) {
    const address = typeof answer === 'string' ? canonicalIp(answer) : undefined;
    if (address === undefined) {
      return refusal('resolution_failed', hostname, 'the resolver answered something that is not an IP address');
    }
    if (!allowlisted) {
      const range = isRefusedAddress(address);
      if (range.refused) {
        return refusal('refused_range', hostname, `${hostname} resolves to ${address}, in the refused range ${range.range}`, {
          address,
          range: range.range,
        });
      }
    }
    if (!addresses.includes(address)) addresses.push(address);
  }
  return { ok: true, host: hostname, addresses };
}

/** One human sentence naming the reason of a refusal. Never contains credentials. */
export function describeRefusal(r: GuardRefusal): string {
  const host = r.host === '' ? 'the URL' : `host ${r.host}`;
  switch (r.reason) {
    case 'invalid_url':
      return `The address guard refused ${host}: it is not a valid URL (${r.detail}).`;
    case 'scheme':
      return `The address guard refused ${host}: ${r.detail}.`;
    case 'credentials_in_url':
      return `The address guard refused ${host}: the URL carries credentials in its userinfo part.`;
    case 'numeric_host':
      return `The address guard refused ${host}: numeric host forms are refused (${r.detail}).`;
    case 'refused_range':
      return `The address guard refused ${host}: address ${r.address ?? '?'} is in the refused range ${r.range ?? '?'}.`;
    case 'resolution_failed':
      return `The address guard refused ${host}: ${r.detail}.`;
  }
}

// ---------------------------------------------------------------------------------------------
// Pinned connections
// ---------------------------------------------------------------------------------------------

/**
 * A lookup for `net.connect`/`tls.connect` that never asks DNS: it answers the one address vetted for
 * this dispatcher's host and refuses any other host name. `net` calls it with `all: true` when
 * happy-eyeballs (`autoSelectFamily`, on by default in Node 20) is active.
 */
function pinnedLookup(expectedHost: string, address: string): LookupFunction {
  const family = ipFamily(address) === 6 ? 6 : 4;
  return (hostname: string, options: LookupOptions, callback: (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void) => {
    if (hostname.toLowerCase() !== expectedHost) {
      const err: NodeJS.ErrnoException = new Error(`pinned lookup for ${expectedHost} asked for ${hostname}`);
      err.code = 'ENOTFOUND';
      callback(err, '', 0);
      return;
    }
    if (options.all === true) callback(null, [{ address, family }]);
    else callback(null, address, family);
  };
}

/**
 * Why one dispatcher per (origin, vetted address), in a small LRU cache:
 *
 * undici pools keep-alive sockets per origin. With one shared Agent and a lookup that reads "the
 * addresses vetted for this request" from mutable state, a request would happily reuse a socket that
 * an EARLIER request opened to a different address (an earlier answer of a rebinding DNS), and two
 * concurrent requests for one host would race on that state. Keying the dispatcher by origin AND
 * address makes the pin a constant of the dispatcher: its lookup can only ever return that one
 * address, every socket in its pool was connected to it, so reuse never crosses a pin, and a stable
 * host still gets keep-alive. Choosing the address ourselves (instead of letting `net` pick among
 * several) also tells us exactly which address a response came from (`GuardedResponse.address`).
 * The cache is per policy (per `createGuardedFetch`); an evicted dispatcher is closed gracefully
 * (in-flight requests finish, idle sockets end).
 */
class PinnedDispatchers {
  readonly #agents = new Map<string, Agent>();
  readonly #max: number;
  #closed = false;

  constructor(max: number) {
    this.#max = max;
  }

  get(origin: string, host: string, address: string, connectTimeoutMs: number): Agent {
    // The connect timeout is an Agent option in undici, so it is part of the key.
    const key = `${origin} ${address} ${connectTimeoutMs}`;
    const existing = this.#agents.get(key);
    if (existing !== undefined) {
      // Refresh LRU position.
      this.#agents.delete(key);
      this.#agents.set(key, existing);
      return existing;
    }
    const agent = new Agent({
      connect: { lookup: pinnedLookup(host, address), timeout: connectTimeoutMs },
      keepAliveTimeout: 4_000,
    });
    this.#agents.set(key, agent);
    while (this.#agents.size > this.#max) {
      const [oldestKey, oldest] = this.#agents.entries().next().value as [string, Agent];
      this.#agents.delete(oldestKey);
      oldest.close().catch(() => undefined);
    }
    return agent;
  }

  get closed(): boolean {
    return this.#closed;
  }

  async close(): Promise<void> {
    this.#closed = true;
    const agents = [...this.#agents.values()];
    this.#agents.clear();
    await Promise.all(agents.map((a) => a.destroy().catch(() => undefined)));
  }
}

// ---------------------------------------------------------------------------------------------
// Failure classification
// ---------------------------------------------------------------------------------------------

const TIMEOUT_CODES = new Set(['UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'ETIMEDOUT']);
const CONNECTION_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'EADDRNOTAVAIL',
  'EAFNOSUPPORT',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'UND_ERR_DESTROYED',
]);
/** Errors that happen before a byte of the request is sent: the next vetted address may be tried. */
const BEFORE_SEND_CODES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'EHOSTDOWN', 'ENETUNREACH', 'ENETDOWN', 'EADDRNOTAVAIL', 'EAFNOSUPPORT']);

function codesOf(err: unknown): string[] {
  const codes: string[] = [];
  let current: unknown = err;
  for (let depth = 0; depth < 4 && typeof current === 'object' && current !== null; depth += 1) {
    const code = errorCode(current);
    if (code !== undefined) codes.push(code);
    current = 'cause' in current ? current.cause : undefined;
  }
  return codes;
}

function messageOf(err: unknown): string {
  if (err instanceof Error) {
    const code = errorCode(err);
    return code === undefined || err.message.includes(code) ? err.message : `${code}: ${err.message}`;
  }
  return String(err);
}

function classifyError(err: unknown): GuardedFailureClass {
  const codes = codesOf(err);
  if (codes.some((c) => TIMEOUT_CODES.has(c))) return 'timeout';
  if (codes.some((c) => CONNECTION_CODES.has(c))) return 'connection';
  if (codes.some((c) => /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_)/.test(c))) return 'connection';
  if (err instanceof Error && /socket hang up|other side closed/i.test(err.message)) return 'connection';
  if (typeof err === 'object' && err !== null && 'syscall' in err) return 'connection';
  // HPE_* parser errors, content-length mismatches, invalid arguments (bad caller headers), ...
  return 'protocol';
}

// ---------------------------------------------------------------------------------------------
// createGuardedFetch
// ---------------------------------------------------------------------------------------------

/** Resolves with ABORTED as soon as `signal` aborts, otherwise with the promise's value. */
const ABORTED: unique symbol = Symbol('aborted');
function unlessAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T | typeof ABORTED> {
  if (signal.aborted) return Promise.resolve(ABORTED);
  return new Promise((resolve, reject) => {
    const onAbort = (): void => resolve(ABORTED);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
  });
}

function responseHeaders(headers: Record<string, string | string[] | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    out[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}

/**
 * The caller's headers, unchanged, except `host`: the Host header (like TLS SNI) is always the URL's
 * host, so a caller cannot aim a pinned connection at another virtual host. Nothing is added here;
 * undici adds only `host`, `connection` and, with a body, `content-length`.
 */
function outgoingHeaders(headers: Record<string, string> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (headers === undefined) return out;
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() === 'host') continue;
    out[name] = value;
  }
  return out;
}

/** At most this many pinned dispatchers (origin × address) are kept open per guarded fetch. */
const MAX_PINNED_DISPATCHERS = 64;

/**
 * Creates the guarded fetch of one policy. It reuses keep-alive connections per (origin, vetted
 * address); `close()` destroys them. `options.resolver` replaces the system resolver (tests inject
 * one to script DNS answers); it is called exactly once per request whose host is a name.
 */
export function createGuardedFetch(policy: GuardPolicy, options: { resolver?: Resolver } = {}): ClosableGuardedFetch {
  const resolver = options.resolver ?? defaultResolver;
  const pins = new PinnedDispatchers(MAX_PINNED_DISPATCHERS);

  const guardedFetch = async (request: GuardedRequest): Promise<GuardedFetchResult> => {
    const started = performance.now();
    const elapsed = (): number => Math.round(performance.now() - started);
    const failed = (cls: GuardedFailureClass, message: string): GuardedFetchResult => ({
      ok: false,
      kind: 'failed',
      failure: { class: cls, message, durationMs: elapsed() },
    });

    if (pins.closed) return failed('connection', 'the guarded fetch has been closed');
    if (!(Number.isFinite(request.timeoutMs) && request.timeoutMs > 0)) {
      return failed('timeout', `timeoutMs must be a positive number of milliseconds (got ${String(request.timeoutMs)})`);
    }
    const maxBytes = request.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES;
    if (request.signal?.aborted === true) return failed('aborted', 'the request was aborted by the caller before it started');

    // One controller for the whole request: the deadline and the caller's signal both abort it, and
    // `ended` remembers which one did so that the failure is classified by cause, not by error text.
    const controller = new AbortController();
    let ended: 'timeout' | 'aborted' | undefined;
    const timer = setTimeout(() => {
      ended ??= 'timeout';
      controller.abort(new Error(`timed out after ${request.timeoutMs} ms`));
    }, request.timeoutMs);
    const onCallerAbort = (): void => {
      ended ??= 'aborted';
      controller.abort(new Error('aborted by the caller'));
    };
    request.signal?.addEventListener('abort', onCallerAbort, { once: true });
    const endedFailure = (): GuardedFetchResult =>
      ended === 'timeout'
        ? failed('timeout', `no complete response within ${request.timeoutMs} ms`)
        : failed('aborted', 'the request was aborted by the caller');

    try {
      let check: UrlCheck | typeof ABORTED;
      try {
        check = await unlessAborted(checkUrl(request.url, policy, resolver), controller.signal);
      } catch (err) {
        // checkUrl catches resolver errors itself; this is a defect guard, not a network path.
        return failed('protocol', `address check failed: ${messageOf(err)}`);
      }
      if (check === ABORTED) return endedFailure();
      if (!check.ok) return { ok: false, kind: 'refused', refusal: check.refusal };

      const url = new URL(request.url);
      const method = request.method ?? 'GET';
      const host = bareHost(check.host);
      let response: Dispatcher.ResponseData | undefined;
      let address = '';
      for (let i = 0; i < check.addresses.length; i += 1) {
        address = check.addresses[i] as string;
        // get() and request() run in one synchronous step: an LRU eviction cannot close this
        // dispatcher between the two.
        const dispatcher = pins.get(url.origin, host, address, Math.min(request.connectTimeoutMs ?? request.timeoutMs, request.timeoutMs));
        try {
          response = await dispatcher.request({
            origin: url.origin,
            path: `${url.pathname}${url.search}`,
            method,
            headers: outgoingHeaders(request.headers),
            body: request.body ?? null,
            signal: controller.signal,
            headersTimeout: request.timeoutMs,
            bodyTimeout: request.timeoutMs,
          });
          break;
        } catch (err) {
          if (ended !== undefined) return endedFailure();
          const beforeSend = codesOf(err).some((c) => BEFORE_SEND_CODES.has(c));
          if (beforeSend && i < check.addresses.length - 1) continue;
          return failed(classifyError(err), messageOf(err));
        }
      }
      if (response === undefined) return failed('connection', 'no vetted address could be reached');

      const body = response.body;
      // A destroyed body emits 'error'; the failure is reported through the result, not as an
      // unhandled stream error.
      body.on('error', () => undefined);
      // A HEAD response declares the length of a body it does not carry.
      const declared = method === 'HEAD' ? 0 : Number(response.headers['content-length']);
      const truncate = request.overLimit === 'truncate';
      if (!truncate && Number.isFinite(declared) && declared > maxBytes) {
        body.destroy();
        return failed('too_large', `the response declares ${declared} bytes, over the limit of ${maxBytes}`);
      }
      const chunks: Buffer[] = [];
      let total = 0;
      try {
        for await (const chunk of body) {
          const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as Uint8Array);
          if (total + buf.length > maxBytes) {
            body.destroy();
            if (!truncate) return failed('too_large', `the response body exceeds the limit of ${maxBytes} bytes`);
            chunks.push(buf.subarray(0, maxBytes - total));
            total = maxBytes;
            break;
          }
          total += buf.length;
          chunks.push(buf);
        }
      } catch (err) {
        if (ended !== undefined) return endedFailure();
        return failed(classifyError(err), messageOf(err));
      }
      if (ended !== undefined) return endedFailure();

      return {
        ok: true,
        response: {
          status: response.statusCode,
          headers: responseHeaders(response.headers),
          body: Buffer.concat(chunks, total),
          durationMs: elapsed(),
          address,
        },
      };
    } catch (err) {
      // Defect guard: nothing above is expected to throw.
      if (ended !== undefined) return endedFailure();
      return failed(classifyError(err), messageOf(err));
    } finally {
      clearTimeout(timer);
      request.signal?.removeEventListener('abort', onCallerAbort);
    }
  };

  return Object.assign(guardedFetch, { close: () => pins.close() });
}
