import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  ANONYMOUS_CLIENT,
  authenticateToken,
  countActiveClients,
  createClient,
  ensureAnonymousClient,
  listClients,
  revokeClient,
} from '../../../src/auth/client-repository.js';
import { CLIENT_TOKEN_LENGTH, generateClientToken, hashClientToken, looksLikeClientToken } from '../../../src/auth/client-token.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// Clients against a real database: tokens (shape, entropy), what is stored (the hash, never the
// token), names, revocation, authentication by token and the anonymous client.

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

const lastUsed = (id: string) =>
  database.pool.oneFirst(sql.type(z.object({ last_used_at: z.number().nullable() }))`SELECT last_used_at FROM clients WHERE id = ${id}`);

describe('client tokens', () => {
  it('are keel_ and 43 base64url characters: 256 random bits', () => {
    const tokens = Array.from({ length: 1000 }, () => generateClientToken());
    for (const token of tokens) {
      expect(token).toMatch(/^keel_[A-Za-z0-9_-]{43}$/);
      expect(token).toHaveLength(48);
      expect(looksLikeClientToken(token)).toBe(true);
      expect(Buffer.from(token.slice(5), 'base64url')).toHaveLength(32);
    }
    expect(CLIENT_TOKEN_LENGTH).toBe(48);
    expect(new Set(tokens).size).toBe(1000);
    // Every base64url character shows up across 1000 tokens (no biased alphabet).
    expect(new Set(tokens.flatMap((token) => [...token.slice(5)])).size).toBe(64);
  });

  it('looksLikeClientToken refuses other shapes', () => {
    const good = generateClientToken();
    for (const bad of ['', 'keel_', good.slice(0, -1), `${good}A`, good.replace('keel_', 'KEEL_'), good.replace('keel_', 'kell_'), `keel_${'+'.repeat(43)}`, `keel_${'='.repeat(43)}`, ` ${good}`]) {
      expect(looksLikeClientToken(bad), bad).toBe(false);
    }
  });

  it('hash to 32 bytes of SHA-256, deterministically', () => {
    const token = generateClientToken();
    expect(hashClientToken(token)).toHaveLength(32);
    expect(hashClientToken(token).equals(hashClientToken(token))).toBe(true);
    expect(hashClientToken(token).equals(hashClientToken(generateClientToken()))).toBe(false);
  });
});

describe('clients', () => {
  it('stores the hash and the hint, never the token', async () => {
    const { client, token } = await created('stored');
    expect(client.tokenHint).toBe(token.slice(-4));
    const row = await database.pool.one(sql.type(z.object({ text: z.string(), token_hash: z.instanceof(Buffer) }))`
      SELECT c::text AS text, token_hash FROM clients c WHERE id = ${client.id}`);
    expect(row.token_hash.equals(hashClientToken(token))).toBe(true);
    expect(row.text).not.toContain(token);
    expect(row.text).not.toContain(token.slice(5));
    expect(row.text).not.toContain(Buffer.from(token, 'utf8').toString('hex'));
    expect(row.token_hash.includes(Buffer.from(token.slice(5, 20), 'utf8'))).toBe(false);
    const everything = await database.pool.anyFirst(sql.type(z.object({ text: z.string() }))`SELECT c::text AS text FROM clients c`);
    expect(everything.join('\n')).not.toContain(token.slice(5));
  });

  it('validates names: 1-64 of [a-zA-Z0-9._-], "anonymous" reserved', async () => {
    for (const bad of ['', 'a'.repeat(65), 'has space', 'slash/name', 'émile', 'semi;colon', 'anonymous']) {
      expect(await createClient(database.pool, bad), JSON.stringify(bad)).toMatchObject({ ok: false, reason: 'invalid_name' });
    }
    for (const good of ['a', 'b'.repeat(64), 'Build-Bot_2.ci']) {
      expect((await createClient(database.pool, good)).ok, good).toBe(true);
    }
  });

  it('refuses a second active client of one name, also when created concurrently', async () => {
    await created('dup');
    expect(await createClient(database.pool, 'dup')).toEqual({ ok: false, reason: 'name_taken' });
    const racing = await Promise.all(Array.from({ length: 6 }, () => createClient(database.pool, 'racer')));
    expect(racing.filter((result) => result.ok)).toHaveLength(1);
    expect(racing.filter((result) => !result.ok)).toEqual(Array(5).fill({ ok: false, reason: 'name_taken' }));
  });

  it('revokes by name or id; a revoked name can be reused; list hides revoked unless asked', async () => {
    const first = await created('rotating');
    expect(await revokeClient(database.pool, 'rotating')).toMatchObject({ ok: true, client: { id: first.client.id } });
    expect(await revokeClient(database.pool, 'rotating')).toEqual({ ok: false, reason: 'already_revoked' });
    expect(await revokeClient(database.pool, first.client.id)).toEqual({ ok: false, reason: 'already_revoked' });

    const second = await created('rotating');
    expect(second.client.id).not.toBe(first.client.id);
    const active = await listClients(database.pool);
    expect(active.filter((client) => client.name === 'rotating').map((client) => client.id)).toEqual([second.client.id]);
    const all = await listClients(database.pool, { includeRevoked: true });
    const rotating = all.filter((client) => client.name === 'rotating');
    expect(rotating.map((client) => client.id)).toEqual([first.client.id, second.client.id]);
    expect(rotating[0]!.revokedAt).toEqual(expect.any(Number));
    expect(rotating[1]!.revokedAt).toBeNull();

    // By name, the active one is chosen; by id (upper case too), exactly that one.
    expect(await revokeClient(database.pool, second.client.id.toUpperCase())).toMatchObject({ ok: true, client: { id: second.client.id } });
    expect(await revokeClient(database.pool, 'no-such-client')).toEqual({ ok: false, reason: 'not_found' });
    expect(await revokeClient(database.pool, '6f1c1a4e-0000-4000-8000-000000000000')).toEqual({ ok: false, reason: 'not_found' });
    expect(await revokeClient(database.pool, ANONYMOUS_CLIENT.id)).toEqual({ ok: false, reason: 'not_found' });
    expect(await revokeClient(database.pool, 'anonymous')).toEqual({ ok: false, reason: 'not_found' });
  });

  it('authenticates an active token; refuses revoked, unknown and malformed ones', async () => {
    const { client, token } = await created('caller');
    expect(await authenticateToken(database.pool, token)).toEqual({ ok: true, client: { id: client.id, name: 'caller' } });
    expect(await authenticateToken(database.pool, generateClientToken())).toEqual({ ok: false });
    expect(await authenticateToken(database.pool, token.slice(0, -1))).toEqual({ ok: false });
    expect(await authenticateToken(database.pool, '')).toEqual({ ok: false });
    await revokeClient(database.pool, client.id);
    expect(await authenticateToken(database.pool, token)).toEqual({ ok: false });
  });

  it('writes last_used_at at most once a minute', async () => {
    const { client, token } = await created('busy');
    expect(await lastUsed(client.id)).toBeNull();
    await authenticateToken(database.pool, token);
    const first = await lastUsed(client.id);
    expect(first).toEqual(expect.any(Number));
    await new Promise((resolve) => setTimeout(resolve, 20));
    await authenticateToken(database.pool, token);
    await authenticateToken(database.pool, token);
    expect(await lastUsed(client.id)).toBe(first);
    await database.pool.query(sql.unsafe`UPDATE clients SET last_used_at = now() - interval '61 seconds' WHERE id = ${client.id}`);
    const stale = await lastUsed(client.id);
    await authenticateToken(database.pool, token);
    expect(await lastUsed(client.id)).toBeGreaterThan(stale!);
  });

  it('counts active clients, not revoked ones nor the anonymous client', async () => {
    const other = await createTestDatabase();
    try {
      expect(await countActiveClients(other.pool)).toBe(0);
      const a = await createClient(other.pool, 'a');
      await createClient(other.pool, 'b');
      expect(await countActiveClients(other.pool)).toBe(2);
      if (a.ok) await revokeClient(other.pool, a.client.id);
      expect(await countActiveClients(other.pool)).toBe(1);
    } finally {
      await other.drop();
    }
  });
});

describe('the anonymous client', () => {
  it('exists after migration, is idempotent to ensure, unlisted, and never reachable by a token', async () => {
    const rows = () => database.pool.anyFirst(sql.type(z.object({ name: z.string() }))`SELECT name FROM clients WHERE id = ${ANONYMOUS_CLIENT.id}`);
    expect(await rows()).toEqual(['anonymous']);
    await ensureAnonymousClient(database.pool);
    await Promise.all([ensureAnonymousClient(database.pool), ensureAnonymousClient(database.pool)]);
    expect(await rows()).toEqual(['anonymous']);
    expect((await listClients(database.pool, { includeRevoked: true })).some((client) => client.id === ANONYMOUS_CLIENT.id)).toBe(false);

    // Even with a known token's hash planted on its row, no token reaches it.
    const token = generateClientToken();
    await database.pool.query(sql.unsafe`UPDATE clients SET token_hash = ${sql.binary(hashClientToken(token))} WHERE id = ${ANONYMOUS_CLIENT.id}`);
    expect(await authenticateToken(database.pool, token)).toEqual({ ok: false });
  });

  it('is re-created when missing', async () => {
    const other = await createTestDatabase();
    try {
      await other.pool.query(sql.unsafe`DELETE FROM clients WHERE id = ${ANONYMOUS_CLIENT.id}`);
      await ensureAnonymousClient(other.pool);
      expect(await other.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM clients WHERE id = ${ANONYMOUS_CLIENT.id}`)).toBe(1);
    } finally {
      await other.drop();
    }
  });
});
