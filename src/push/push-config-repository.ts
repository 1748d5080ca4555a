import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import type { Sealer } from '../sealing/sealer.js';
import { newRowId } from '../db/row-id.js';

// push_configs: where a task's events are pushed. Credentials and token are sealed and only ever
// shown masked: the scheme and the last four characters.

export const pushConfigContext = (taskId: string, id: string, column: 'token' | 'credentials') => ({ table: 'push_configs', column, rowId: `${taskId}/${id}` });

const configRow = z.object({
  task_id: z.string(),
  id: z.string(),
  owner: z.string(),
  url: z.string(),
  token: z.instanceof(Buffer).nullable(),
  token_hint: z.string().nullable(),
  auth_scheme: z.string().nullable(),
  credentials: z.instanceof(Buffer).nullable(),
  credentials_hint: z.string().nullable(),
  state: z.enum(['active', 'paused', 'stopped']),
  state_reason: z.string().nullable(),
  created_at: z.number(),
  updated_at: z.number(),
  deleted_at: z.number().nullable(),
});
export type PushConfigRow = z.infer<typeof configRow>;

/** `sequenced`: created by a request that activated the sequenced-events extension: its deliveries' bodies carry the event's sequence. */
export type NewPushConfig = {
  taskId: string;
  id?: string | undefined;
  owner: string;
  url: string;
  token?: string | undefined;
  authentication?: { scheme: string; credentials?: string | undefined } | undefined;
  sequenced?: boolean | undefined;
};

export const HINTLESS_MAX_LENGTH = 8;

/**
 * The last four characters of a secret, kept in clear for display; none for a secret of eight
 * characters or fewer, where four would be half of it or more (it is then shown by its scheme
 * alone, a token by the mask alone). Counted in code points, so a hint never splits a surrogate
 * pair. Rows written before this rule had their short hints cleared by sql/0010.
 */
export function secretHint(secret: string | undefined): string | null {
  if (!secret) return null;
  const characters = [...secret];
  return characters.length > HINTLESS_MAX_LENGTH ? characters.slice(-4).join('') : null;
}
export const MASK = '…';

export type CreatePushConfigResult = { ok: true; row: PushConfigRow } | { ok: false; reason: 'exists' };

export async function createPushConfig(db: CommonQueryMethods, sealer: Sealer, config: NewPushConfig): Promise<CreatePushConfigResult> {
  const id = config.id ?? newRowId();
  const token = config.token ? sealer.sealJson(pushConfigContext(config.taskId, id, 'token'), config.token) : null;
  const credentials = config.authentication?.credentials ? sealer.sealJson(pushConfigContext(config.taskId, id, 'credentials'), config.authentication.credentials) : null;
  const row = await db.maybeOne(sql.type(configRow)`
    INSERT INTO push_configs (task_id, id, owner, url, token, token_hint, auth_scheme, credentials, credentials_hint, sequenced)
    VALUES (${config.taskId}, ${id}, ${config.owner}, ${config.url}, ${token === null ? null : sql.binary(token)}, ${secretHint(config.token)},
      ${config.authentication?.scheme ?? null}, ${credentials === null ? null : sql.binary(credentials)}, ${secretHint(config.authentication?.credentials)},
      ${config.sequenced === true})
    ON CONFLICT (task_id, id) DO NOTHING
    RETURNING *`);
  return row ? { ok: true, row } : { ok: false, reason: 'exists' };
}

/** Whether the task has (or had: deleted configs keep their rows) a config with this id. */
export async function pushConfigIdTaken(db: CommonQueryMethods, taskId: string, id: string): Promise<boolean> {
  return db.oneFirst(sql.type(z.object({ taken: z.boolean() }))`
    SELECT EXISTS (SELECT 1 FROM push_configs WHERE task_id = ${taskId} AND id = ${id}) AS taken`);
}

export async function getPushConfig(db: CommonQueryMethods, taskId: string, id: string): Promise<PushConfigRow | null> {
  return db.maybeOne(sql.type(configRow)`SELECT * FROM push_configs WHERE task_id = ${taskId} AND id = ${id} AND deleted_at IS NULL`);
}

export async function listPushConfigs(db: CommonQueryMethods, taskId: string, limit: number, afterId?: string): Promise<readonly PushConfigRow[]> {
  return db.any(sql.type(configRow)`
    SELECT * FROM push_configs WHERE task_id = ${taskId} AND deleted_at IS NULL
      ${afterId === undefined ? sql.fragment`` : sql.fragment`AND id > ${afterId}`}
    ORDER BY id LIMIT ${limit}`);
}

/** Idempotent: deleting a deleted or unknown config is not an error. */
export async function deletePushConfig(db: CommonQueryMethods, taskId: string, id: string): Promise<void> {
  await db.query(sql.unsafe`UPDATE push_configs SET deleted_at = now(), updated_at = now() WHERE task_id = ${taskId} AND id = ${id} AND deleted_at IS NULL`);
}

/**
 * The config as Get/List show it: secrets masked to the scheme and the last four characters; a
 * credential without a hint (eight characters or fewer) by its scheme alone, such a token by the
 * mask alone.
 */
export function maskedPushConfig(row: PushConfigRow): Record<string, unknown> {
  return {
    id: row.id,
    taskId: row.task_id,
    url: row.url,
    ...(row.token !== null ? { token: `${MASK}${row.token_hint ?? ''}` } : {}),
    ...(row.auth_scheme !== null ? { authentication: { scheme: row.auth_scheme, ...(row.credentials_hint !== null ? { credentials: `${MASK}${row.credentials_hint}` } : {}) } } : {}),
  };
}
