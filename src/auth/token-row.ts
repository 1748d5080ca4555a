import { sql } from 'slonik';
import { z } from 'zod';

// A2A clients (sql/0003_clients.sql) and admin tokens (sql/0008_admin_tokens.sql) are stored alike:
// a name, the SHA-256 of a token shown once, its last characters in clear, and when it was created,
// last used and revoked. Both tables are read through this one mapping, so what a listing shows
// about a token (never the token nor its hash) is decided in one place.

/** What may be shown about a token holder: never the token nor the token's hash. */
export type TokenHolderInfo = {
  id: string;
  name: string;
  /** The token's last four characters. */
  tokenHint: string;
  createdAt: number;
  lastUsedAt: number | null;
  revokedAt: number | null;
};

export const tokenHolderRow = z.object({
  id: z.string().uuid(),
  name: z.string(),
  token_hint: z.string(),
  created_at: z.number(),
  last_used_at: z.number().nullable(),
  revoked_at: z.number().nullable(),
});
export type TokenHolderRow = z.infer<typeof tokenHolderRow>;

/** The columns tokenHolderRow parses, for SELECT and RETURNING lists. */
export const tokenHolderColumns = sql.fragment`id, name, token_hint, created_at, last_used_at, revoked_at`;

export const toTokenHolderInfo = (row: TokenHolderRow): TokenHolderInfo => ({
  id: row.id,
  name: row.name,
  tokenHint: row.token_hint,
  createdAt: row.created_at,
  lastUsedAt: row.last_used_at,
  revokedAt: row.revoked_at,
});
