import { randomUUID } from 'node:crypto';
import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import type { Sealer } from '../sealing/sealer.js';

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

export type NewPushConfig = { taskId: string; id?: string | undefined; owner: string; url: string; token?: string | undefined; authentication?: { scheme: string; credentials?: string | undefined } | undefined };

const hint = (secret: string | undefined) => (secret ? secret.slice(-4) : null);
export const MASK = '…';

export type CreatePushConfigResult = { ok: true; row: PushConfigRow } | { ok: false; reason: 'exists' };

export async function createPushConfig(db: CommonQueryMethods, sealer: Sealer, config: NewPushConfig): Promise<CreatePushConfigResult> {
  const id = config.id ?? randomUUID();
  const token = config.token ? sealer.sealJson(pushConfigContext(config.taskId, id, 'token'), config.token) : null;
  const credentials = config.authentication?.credentials ? sealer.sealJson(pushConfigContext(config.taskId, id, 'credentials'), config.authentication.credentials) : null;
  const row = await db.maybeOne(sql.type(configRow)`
    INSERT INTO push_configs (task_id, id, owner, url, token, token_hint, auth_scheme, credentials, credentials_hint)
    VALUES (${config.taskId}, ${id}, ${config.owner}, ${config.url}, ${token === null ? null : sql.binary(token)}, ${hint(config.token)},
      ${config.authentication?.scheme ?? null}, ${credentials === null ? null : sql.binary(credentials)}, ${hint(config.authentication?.credentials)})
    ON CONFLICT (task_id, id) DO NOTHING
    RETURNING *`);
  return row ? { ok: true, row } : { ok: false, reason: 'exists' };
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

/** The config as Get/List show it: secrets masked to the scheme and the last four characters. */
export function maskedPushConfig(row: PushConfigRow): Record<string, unknown> {
  return {
    id: row.id,
    taskId: row.task_id,
    url: row.url,
    ...(row.token_hint !== null ? { token: `${MASK}${row.token_hint}` } : {}),
    ...(row.auth_scheme !== null ? { authentication: { scheme: row.auth_scheme, ...(row.credentials_hint !== null ? { credentials: `${MASK}${row.credentials_hint}` } : {}) } } : {}),
  };
}
