import { UniqueIntegrityConstraintViolationError, sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { generateClientToken, hashClientToken, looksLikeClientToken, tokenHint } from './client-token.js';
import { tokenHolderColumns, tokenHolderRow, toTokenHolderInfo, type TokenHolderInfo } from './token-row.js';
import { isUuid } from '../db/uuid.js';
import { newRowId } from '../db/row-id.js';

// The `clients` table (sql/0003_clients.sql): inbound A2A clients and their hashed tokens. A token
// is shown once, by createClient, and never stored; expected failures are values, not exceptions.

export type Db = CommonQueryMethods;

/** The owner of every task under `auth.mode: none`; a row (tasks reference clients.id) that no token reaches. */
export const ANONYMOUS_CLIENT = Object.freeze({ id: '00000000-0000-0000-0000-000000000000', name: 'anonymous' });

export const CLIENT_NAME_PATTERN = /^[a-zA-Z0-9._-]{1,64}$/;
const RESERVED_NAMES: ReadonlySet<string> = new Set([ANONYMOUS_CLIENT.name]);

/** Why `name` cannot name a new client, or null when it can. */
export function clientNameProblem(name: string): string | null {
  if (!CLIENT_NAME_PATTERN.test(name)) return 'a client name is 1 to 64 characters among letters, digits, ".", "_" and "-"';
  if (RESERVED_NAMES.has(name)) return `the name "${name}" is reserved`;
  return null;
}

/** What may be shown about a client: never its token nor the token's hash. */
export type ClientInfo = TokenHolderInfo;

export type AuthenticatedClient = { id: string; name: string };

export type CreateClientResult =
  | { ok: true; client: ClientInfo; token: string }
  | { ok: false; reason: 'name_taken' }
  | { ok: false; reason: 'invalid_name'; message: string };

/**
 * Creates a client with a fresh token. The token is returned here once; only its hash is stored.
 * Two concurrent creations of one name end with one client and one `name_taken`.
 */
export async function createClient(db: Db, name: string): Promise<CreateClientResult> {
  const problem = clientNameProblem(name);
  if (problem !== null) return { ok: false, reason: 'invalid_name', message: problem };
  const token = generateClientToken();
  try {
    const row = await db.one(sql.type(tokenHolderRow)`
      INSERT INTO clients (id, name, token_hash, token_hint)
      VALUES (${newRowId()}, ${name}, ${sql.binary(hashClientToken(token))}, ${tokenHint(token)})
      RETURNING ${tokenHolderColumns}`);
    return { ok: true, client: toTokenHolderInfo(row), token };
  } catch (error) {
    // The partial unique index on active names decides between concurrent creators.
    if (error instanceof UniqueIntegrityConstraintViolationError && error.constraint === 'clients_active_name_key') {
      return { ok: false, reason: 'name_taken' };
    }
    throw error;
  }
}

/** Clients by creation time (the anonymous client is internal and never listed). */
export async function listClients(db: Db, options: { includeRevoked?: boolean } = {}): Promise<readonly ClientInfo[]> {
  const rows = await db.any(sql.type(tokenHolderRow)`
    SELECT ${tokenHolderColumns} FROM clients
    WHERE id <> ${ANONYMOUS_CLIENT.id} ${options.includeRevoked ? sql.fragment`` : sql.fragment`AND revoked_at IS NULL`}
    ORDER BY created_at, name, id`);
  return rows.map(toTokenHolderInfo);
}

/**
 * The client `nameOrId` designates: an id; else the active client of that name; else the most
 * recently created revoked one (so that revoking it again says `already_revoked`).
 */
export async function findClient(db: Db, nameOrId: string): Promise<ClientInfo | null> {
  const id = isUuid(nameOrId) ? nameOrId.toLowerCase() : null;
  const byId = sql.fragment`coalesce(id = ${id}::uuid, false)`;
  const row = await db.maybeOne(sql.type(tokenHolderRow)`
    SELECT ${tokenHolderColumns} FROM clients
    WHERE id <> ${ANONYMOUS_CLIENT.id} AND (${byId} OR name = ${nameOrId})
    ORDER BY (${byId}) DESC, (revoked_at IS NULL) DESC, created_at DESC
    LIMIT 1`);
  return row === null ? null : toTokenHolderInfo(row);
}

export type RevokeClientResult = { ok: true; client: ClientInfo } | { ok: false; reason: 'not_found' | 'already_revoked' };

/** Revokes a client by name or id: its token stops authenticating (see ClientAuthenticator for the cache window). */
export async function revokeClient(db: Db, nameOrId: string): Promise<RevokeClientResult> {
  const found = await findClient(db, nameOrId);
  if (found === null) return { ok: false, reason: 'not_found' };
  const row = await db.maybeOne(sql.type(tokenHolderRow)`
    UPDATE clients SET revoked_at = now()
    WHERE id = ${found.id} AND revoked_at IS NULL
    RETURNING ${tokenHolderColumns}`);
  return row === null ? { ok: false, reason: 'already_revoked' } : { ok: true, client: toTokenHolderInfo(row) };
}

export type AuthenticateTokenResult = { ok: true; client: AuthenticatedClient } | { ok: false };

/** How stale `last_used_at` may get before a successful authentication writes it again. */
export const LAST_USED_RESOLUTION_SECONDS = 60;

const authenticatedRow = z.object({ id: z.string().uuid(), name: z.string() });

/**
 * The active client a token belongs to. One statement, the same for every outcome: an indexed
 * equality on the token's SHA-256 (never a comparison over the token itself). Revoked, unknown and
 * anonymous all answer `{ ok: false }`. `last_used_at` is written only when it is older than
 * LAST_USED_RESOLUTION_SECONDS, so a busy client does not turn every request into a write.
 */
export async function authenticateToken(db: Db, token: string): Promise<AuthenticateTokenResult> {
  // The token format is public: refusing a malformed value early reveals nothing.
  if (!looksLikeClientToken(token)) return { ok: false };
  const row = await db.maybeOne(sql.type(authenticatedRow)`
    WITH found AS (
      SELECT id, name, last_used_at FROM clients
      WHERE token_hash = ${sql.binary(hashClientToken(token))} AND revoked_at IS NULL AND id <> ${ANONYMOUS_CLIENT.id}
    ), touched AS (
      UPDATE clients SET last_used_at = now()
      FROM found
      WHERE clients.id = found.id AND clients.revoked_at IS NULL
        AND (found.last_used_at IS NULL OR found.last_used_at < now() - ${sql.interval({ seconds: LAST_USED_RESOLUTION_SECONDS })})
      RETURNING clients.id
    )
    SELECT id, name FROM found`);
  return row === null ? { ok: false } : { ok: true, client: { id: row.id, name: row.name } };
}

/** Clients whose token may authenticate (the anonymous client not counted). */
export async function countActiveClients(db: Db): Promise<number> {
  return db.oneFirst(sql.type(z.object({ count: z.number() }))`
    SELECT count(*)::int AS count FROM clients WHERE revoked_at IS NULL AND id <> ${ANONYMOUS_CLIENT.id}`);
}

/** Every client row ever created, revoked ones included (the anonymous client not counted). */
export async function countAllClients(db: Db): Promise<number> {
  return db.oneFirst(sql.type(z.object({ count: z.number() }))`
    SELECT count(*)::int AS count FROM clients WHERE id <> ${ANONYMOUS_CLIENT.id}`);
}

/**
 * Makes sure the anonymous client's row exists (migration 0003 inserts it; this repairs a missing
 * one). Its token hash is random bytes nobody knows a preimage of, and lookups skip its id.
 */
export async function ensureAnonymousClient(db: Db): Promise<void> {
  await db.query(sql.unsafe`
    INSERT INTO clients (id, name, token_hash, token_hint)
    VALUES (${ANONYMOUS_CLIENT.id}, ${ANONYMOUS_CLIENT.name}, ${sql.binary(hashClientToken(generateClientToken()))}, 'none')
    ON CONFLICT DO NOTHING`);
}
