import { ANONYMOUS_CLIENT, authenticateToken, type AuthenticatedClient, type Db } from './client-repository.js';
import { hashClientToken, looksLikeClientToken } from './client-token.js';

export type AuthenticateResult = { ok: true; client: AuthenticatedClient } | { ok: false; reason: 'missing' | 'malformed' | 'invalid' };

export type ClientAuthenticatorOptions = {
  /** `config.auth.mode`: under 'none' every request is the anonymous client. */
  mode: 'token' | 'none';
  /**
   * How long a positive lookup is reused, in ms (default 5000). This is also the longest a revoked
   * token keeps working in a process that authenticated it just before the revocation.
   */
  cacheTtlMs?: number;
  /** At most this many tokens are cached (default 1000); the oldest entry makes room. */
  cacheMaxEntries?: number;
  /** Clock, for tests. */
  now?: () => number;
};

export const DEFAULT_AUTH_CACHE_TTL_MS = 5_000;
export const DEFAULT_AUTH_CACHE_MAX_ENTRIES = 1_000;

// `Authorization: Bearer <token>`: the scheme is case-insensitive (RFC 9110 §11.1), separated from
// the credentials by one or more spaces.
const BEARER = /^bearer +(\S+) *$/i;

type CacheEntry = { client: AuthenticatedClient; expiresAt: number };

/**
 * Decides who is calling, on every A2A request. Only `Authorization: Bearer <token>` is accepted.
 *
 * Positive lookups are cached per token (keyed by the token's hash, so no token is kept in memory
 * longer than the request) for `cacheTtlMs`: revoking a client takes effect everywhere within that
 * time (5 s by default). Refusals are never cached, so a new client works at once. Concurrent
 * requests with the same uncached token share one database lookup.
 */
export class ClientAuthenticator {
  readonly #db: Db;
  readonly #mode: 'token' | 'none';
  readonly #ttlMs: number;
  readonly #maxEntries: number;
  readonly #now: () => number;
  readonly #cache = new Map<string, CacheEntry>();
  readonly #inflight = new Map<string, Promise<AuthenticateResult>>();

  constructor(db: Db, options: ClientAuthenticatorOptions) {
    this.#db = db;
    this.#mode = options.mode;
    this.#ttlMs = options.cacheTtlMs ?? DEFAULT_AUTH_CACHE_TTL_MS;
    this.#maxEntries = Math.max(0, options.cacheMaxEntries ?? DEFAULT_AUTH_CACHE_MAX_ENTRIES);
    this.#now = options.now ?? Date.now;
  }

  async authenticate(authorizationHeader: string | undefined): Promise<AuthenticateResult> {
    if (this.#mode === 'none') return { ok: true, client: { ...ANONYMOUS_CLIENT } };
    if (authorizationHeader === undefined || authorizationHeader.trim() === '') return { ok: false, reason: 'missing' };
    const match = BEARER.exec(authorizationHeader.trim());
    const token = match?.[1];
    if (token === undefined || !looksLikeClientToken(token)) return { ok: false, reason: 'malformed' };

    const key = hashClientToken(token).toString('base64');
    const cached = this.#cache.get(key);
    if (cached !== undefined) {
      if (cached.expiresAt > this.#now()) return { ok: true, client: { ...cached.client } };
      this.#cache.delete(key);
    }
    const pending = this.#inflight.get(key);
    if (pending !== undefined) return pending;
    const lookup = this.#lookup(key, token).finally(() => this.#inflight.delete(key));
    this.#inflight.set(key, lookup);
    return lookup;
  }

  /** Forgets every cached lookup (a revocation made in this process can call it to apply at once). */
  clear(): void {
    this.#cache.clear();
  }

  /** Number of cached tokens (for tests and metrics). */
  get cacheSize(): number {
    return this.#cache.size;
  }

  async #lookup(key: string, token: string): Promise<AuthenticateResult> {
    const found = await authenticateToken(this.#db, token);
    if (!found.ok) return { ok: false, reason: 'invalid' };
    if (this.#ttlMs > 0 && this.#maxEntries > 0) {
      while (this.#cache.size >= this.#maxEntries) {
        const oldest = this.#cache.keys().next().value;
        if (oldest === undefined) break;
        this.#cache.delete(oldest);
      }
      this.#cache.set(key, { client: found.client, expiresAt: this.#now() + this.#ttlMs });
    }
    return { ok: true, client: { ...found.client } };
  }
}
