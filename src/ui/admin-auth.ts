import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { UniqueIntegrityConstraintViolationError, sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { hashClientToken, TOKEN_HINT_LENGTH } from '../auth/client-token.js';
import { tokenHolderColumns, tokenHolderRow, toTokenHolderInfo, type TokenHolderInfo } from '../auth/token-row.js';
import { isUuid } from '../db/uuid.js';
import { newRowId } from '../db/row-id.js';

// Admin tokens and the browser sessions they open (sql/0008_admin_tokens.sql). Tokens follow the
// client-token pattern (src/auth/client-token.ts): 256 random bits, a recognisable prefix, only
// the SHA-256 stored (see hashClientToken for why a fast unsalted hash is right for random tokens).
// A session id is 256 random bits in an HttpOnly cookie, stored hashed with its expiry; its CSRF
// token is derived from it (SHA-256 under a domain prefix), so it needs no storage and cannot be
// computed without the cookie.

export const ADMIN_TOKEN_PREFIX = 'keel_admin_';
const ADMIN_TOKEN_PATTERN = /^keel_admin_[A-Za-z0-9_-]{43}$/;
export const ADMIN_NAME_PATTERN = /^[a-zA-Z0-9._-]{1,64}$/;
/** How long a login lasts. */
export const SESSION_TTL_MS = 12 * 60 * 60 * 1000;

export function generateAdminToken(): string {
  return `${ADMIN_TOKEN_PREFIX}${randomBytes(32).toString('base64url')}`;
}

export function looksLikeAdminToken(value: string): boolean {
  return ADMIN_TOKEN_PATTERN.test(value);
}

const hash = (secret: string) => hashClientToken(secret);

export type AdminTokenInfo = TokenHolderInfo;

export async function createAdminToken(db: CommonQueryMethods, name: string): Promise<{ token: string; info: AdminTokenInfo }> {
  if (!ADMIN_NAME_PATTERN.test(name)) throw new Error('an admin token name is 1 to 64 characters among letters, digits, ".", "_" and "-"');
  for (;;) {
    const token = generateAdminToken();
    try {
      const row = await db.one(sql.type(tokenHolderRow)`
        INSERT INTO admin_tokens (id, name, token_hash, token_hint)
        VALUES (${newRowId()}, ${name}, ${sql.binary(hash(token))}, ${token.slice(-TOKEN_HINT_LENGTH)})
        RETURNING ${tokenHolderColumns}`);
      return { token, info: toTokenHolderInfo(row) };
    } catch (error) {
      // 256 random bits do not collide; should they, draw again rather than fail.
      if (!(error instanceof UniqueIntegrityConstraintViolationError)) throw error;
    }
  }
}

export async function listAdminTokens(db: CommonQueryMethods, includeRevoked: boolean): Promise<AdminTokenInfo[]> {
  const rows = await db.any(sql.type(tokenHolderRow)`
    SELECT ${tokenHolderColumns} FROM admin_tokens
    WHERE ${includeRevoked ? sql.fragment`true` : sql.fragment`revoked_at IS NULL`} ORDER BY created_at, id`);
  return rows.map(toTokenHolderInfo);
}

/** Revokes a token by id, or by name when exactly one live token has it; its sessions end with it. */
export async function revokeAdminToken(db: CommonQueryMethods, reference: string): Promise<{ ok: true; info: AdminTokenInfo } | { ok: false; reason: 'not_found' | 'ambiguous' }> {
  return db.transaction(async (transaction) => {
    const byId = isUuid(reference);
    const rows = await transaction.any(sql.type(tokenHolderRow)`
      UPDATE admin_tokens SET revoked_at = now()
      WHERE revoked_at IS NULL AND ${byId ? sql.fragment`id = ${reference}` : sql.fragment`name = ${reference}`}
        AND (SELECT count(*) FROM admin_tokens WHERE revoked_at IS NULL AND ${byId ? sql.fragment`id = ${reference}` : sql.fragment`name = ${reference}`}) = 1
      RETURNING ${tokenHolderColumns}`);
    if (rows.length === 0) {
      const live = await transaction.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT count(*)::int AS n FROM admin_tokens WHERE revoked_at IS NULL AND ${byId ? sql.fragment`id = ${reference}` : sql.fragment`name = ${reference}`}`);
      return { ok: false as const, reason: live > 1 ? ('ambiguous' as const) : ('not_found' as const) };
    }
    await transaction.query(sql.unsafe`DELETE FROM admin_sessions WHERE token_id = ${rows[0]!.id}`);
    return { ok: true as const, info: toTokenHolderInfo(rows[0]!) };
  });
}

export type AdminSession = { idHash: Buffer; tokenId: string; tokenName: string; expiresAt: number; csrf: string };

/** The CSRF token of a session: a one-way function of its id. */
export function csrfTokenFor(sessionId: string): string {
  return createHash('sha256').update(`keel-ui-csrf\u0000${sessionId}`, 'utf8').digest('base64url');
}

export function csrfMatches(sessionId: string, presented: unknown): boolean {
  if (typeof presented !== 'string' || presented.length === 0) return false;
  const expected = Buffer.from(csrfTokenFor(sessionId), 'utf8');
  const given = Buffer.from(presented, 'utf8');
  return expected.length === given.length && timingSafeEqual(expected, given);
}

/**
 * A login: the token is checked by one indexed lookup of its hash; a live token opens a session.
 * Returns the new session id (for the cookie) or null. Expired sessions are cleared on the way.
 */
export async function openSession(db: CommonQueryMethods, token: string, ttlMs = SESSION_TTL_MS): Promise<{ sessionId: string; expiresAt: number; tokenName: string } | null> {
  if (!looksLikeAdminToken(token)) return null;
  return db.transaction(async (transaction) => {
    const found = await transaction.maybeOne(sql.type(z.object({ id: z.string(), name: z.string() }))`
      UPDATE admin_tokens SET last_used_at = now() WHERE token_hash = ${sql.binary(hash(token))} AND revoked_at IS NULL RETURNING id, name`);
    if (!found) return null;
    await transaction.query(sql.unsafe`DELETE FROM admin_sessions WHERE expires_at < now()`);
    const sessionId = randomBytes(32).toString('base64url');
    const expiresAt = await transaction.oneFirst(sql.type(z.object({ expires_at: z.number() }))`
      INSERT INTO admin_sessions (id_hash, token_id, expires_at)
      VALUES (${sql.binary(hash(sessionId))}, ${found.id}, now() + ${sql.interval({ seconds: Math.ceil(ttlMs / 1000) })})
      RETURNING expires_at`);
    return { sessionId, expiresAt, tokenName: found.name };
  });
}

const SESSION_ID_PATTERN = /^[A-Za-z0-9_-]{43}$/;

/** The live session of a cookie value, or null (unknown, expired, or its token revoked). */
export async function findSession(db: CommonQueryMethods, sessionId: string): Promise<AdminSession | null> {
  if (!SESSION_ID_PATTERN.test(sessionId)) return null;
  const idHash = sql.binary(hash(sessionId));
  // Reading is the common case (pages poll); last_seen_at is written at most once a minute.
  const row = await db.maybeOne(sql.type(z.object({ token_id: z.string(), name: z.string(), expires_at: z.number() }))`
    WITH touched AS (
      UPDATE admin_sessions SET last_seen_at = now() WHERE id_hash = ${idHash} AND last_seen_at < now() - interval '1 minute' RETURNING 1)
    SELECT s.token_id, t.name, s.expires_at
    FROM admin_sessions s JOIN admin_tokens t ON t.id = s.token_id
    WHERE s.id_hash = ${idHash} AND s.expires_at > now() AND t.revoked_at IS NULL`);
  if (!row) return null;
  return { idHash: hash(sessionId), tokenId: row.token_id, tokenName: row.name, expiresAt: row.expires_at, csrf: csrfTokenFor(sessionId) };
}

export async function closeSession(db: CommonQueryMethods, sessionId: string): Promise<void> {
  if (!SESSION_ID_PATTERN.test(sessionId)) return;
  await db.query(sql.unsafe`DELETE FROM admin_sessions WHERE id_hash = ${sql.binary(hash(sessionId))}`);
}
