import type { CommonQueryMethods } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ClientAuthenticator } from '../../../src/auth/client-authenticator.js';
import { ANONYMOUS_CLIENT, createClient, revokeClient } from '../../../src/auth/client-repository.js';
import { generateClientToken } from '../../../src/auth/client-token.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// What the HTTP layer asks on every A2A request: who is calling, from the Authorization header.

let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase();
});
afterAll(async () => database?.drop());

async function created(name: string) {
  const result = await createClient(database.pool, name);
  if (!result.ok) throw new Error(`createClient(${name}): ${result.reason}`);
  return result;
}

/** The pool, counting the lookups that reach the database. */
function countingDb(): { db: CommonQueryMethods; lookups: () => number } {
  let count = 0;
  const db = new Proxy(database.pool, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver) as unknown;
      if (property === 'maybeOne' && typeof value === 'function') {
        return (...args: unknown[]) => {
          count += 1;
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        };
      }
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { db, lookups: () => count };
}

describe('ClientAuthenticator (auth.mode token)', () => {
  it('accepts Bearer <token>, the scheme in any case', async () => {
    const { client, token } = await created('bearer');
    const auth = new ClientAuthenticator(database.pool, { mode: 'token' });
    for (const header of [`Bearer ${token}`, `bearer ${token}`, `BEARER ${token}`, `Bearer   ${token}`, ` Bearer ${token} `]) {
      expect(await auth.authenticate(header), header).toEqual({ ok: true, client: { id: client.id, name: 'bearer' } });
    }
  });

  it('answers missing, malformed and invalid', async () => {
    const { token } = await created('shapes');
    const auth = new ClientAuthenticator(database.pool, { mode: 'token' });
    expect(await auth.authenticate(undefined)).toEqual({ ok: false, reason: 'missing' });
    expect(await auth.authenticate('')).toEqual({ ok: false, reason: 'missing' });
    expect(await auth.authenticate('   ')).toEqual({ ok: false, reason: 'missing' });
    for (const header of [
      token, // no scheme
      `Basic ${token}`, // wrong scheme
      `Token ${token}`,
      `Basic ${Buffer.from(`user:${token}`).toString('base64')}`,
      'Bearer',
      'Bearer ',
      'Bearer not-a-token',
      `Bearer ${token.slice(0, -1)}`,
      `Bearer ${token} extra`,
      `Bearer ${token},Bearer ${token}`,
      `Bearer\t${token}`,
    ]) {
      expect(await auth.authenticate(header), header).toEqual({ ok: false, reason: 'malformed' });
    }
    expect(await auth.authenticate(`Bearer ${generateClientToken()}`)).toEqual({ ok: false, reason: 'invalid' });
  });

  it('refuses a revoked token once the cache entry expired, never caching refusals', async () => {
    let now = 1_000_000;
    const { client, token } = await created('revoked-later');
    const auth = new ClientAuthenticator(database.pool, { mode: 'token', cacheTtlMs: 5_000, now: () => now });
    expect(await auth.authenticate(`Bearer ${token}`)).toMatchObject({ ok: true });
    expect(await revokeClient(database.pool, client.id)).toMatchObject({ ok: true });
    // Within the TTL the cached answer stands: the documented revocation window.
    now += 4_999;
    expect(await auth.authenticate(`Bearer ${token}`)).toMatchObject({ ok: true });
    now += 2;
    expect(await auth.authenticate(`Bearer ${token}`)).toEqual({ ok: false, reason: 'invalid' });
    expect(await auth.authenticate(`Bearer ${token}`)).toEqual({ ok: false, reason: 'invalid' });
    // A fresh authenticator (another process) refuses at once.
    expect(await new ClientAuthenticator(database.pool, { mode: 'token' }).authenticate(`Bearer ${token}`)).toEqual({ ok: false, reason: 'invalid' });
  });

  it('with a short real TTL, revocation takes effect within it', async () => {
    const { client, token } = await created('short-ttl');
    const auth = new ClientAuthenticator(database.pool, { mode: 'token', cacheTtlMs: 100 });
    expect(await auth.authenticate(`Bearer ${token}`)).toMatchObject({ ok: true });
    await revokeClient(database.pool, client.name);
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(await auth.authenticate(`Bearer ${token}`)).toEqual({ ok: false, reason: 'invalid' });
  });

  it('caches positive lookups, bounded, and shares one lookup between concurrent requests', async () => {
    const clients = await Promise.all(['c1', 'c2', 'c3'].map(created));
    const { db, lookups } = countingDb();
    const auth = new ClientAuthenticator(db, { mode: 'token', cacheMaxEntries: 2 });
    const header = (index: number) => `Bearer ${clients[index]!.token}`;

    const together = await Promise.all(Array.from({ length: 10 }, () => auth.authenticate(header(0))));
    expect(together.every((result) => result.ok)).toBe(true);
    expect(lookups()).toBe(1);
    await auth.authenticate(header(0));
    expect(lookups()).toBe(1);

    await auth.authenticate(header(1));
    await auth.authenticate(header(2));
    expect(lookups()).toBe(3);
    expect(auth.cacheSize).toBe(2);
    await auth.authenticate(header(0)); // evicted as the oldest
    expect(lookups()).toBe(4);

    // Unknown tokens are looked up every time (a refusal is never cached).
    const unknown = `Bearer ${generateClientToken()}`;
    await auth.authenticate(unknown);
    await auth.authenticate(unknown);
    expect(lookups()).toBe(6);
    // Malformed headers never reach the database.
    await auth.authenticate('Bearer nope');
    await auth.authenticate(undefined);
    expect(lookups()).toBe(6);
    auth.clear();
    expect(auth.cacheSize).toBe(0);
  });
});

describe('ClientAuthenticator (auth.mode none)', () => {
  it('is the anonymous client, whatever the header, and that client is a row', async () => {
    const { token } = await created('ignored-in-none');
    const auth = new ClientAuthenticator(database.pool, { mode: 'none' });
    for (const header of [undefined, '', 'Basic abc', `Bearer ${token}`, `Bearer ${generateClientToken()}`]) {
      expect(await auth.authenticate(header)).toEqual({ ok: true, client: { id: ANONYMOUS_CLIENT.id, name: 'anonymous' } });
    }
    expect(ANONYMOUS_CLIENT.id).toBe('00000000-0000-0000-0000-000000000000');
    const tokenAuth = new ClientAuthenticator(database.pool, { mode: 'token' });
    expect(await tokenAuth.authenticate(undefined)).toEqual({ ok: false, reason: 'missing' });
  });
});
