import { sql, type DatabasePool, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';
import { createKeyFileExclusive, readKeyFile, writeKeyFile } from './key-file.js';
import { generateMasterKey, MasterKeyRing, parseMasterKeyList, type MasterKey } from './master-key.js';
import { rewrapSealed } from './envelope.js';
import { SEALED_COLUMNS, type SealedColumn } from './sealed-columns.js';
import { createSealer, type Sealer } from './sealer.js';

// Where master keys come from, which ones the database needs, and rotation. Keel never puts a
// fresh key over old data: a key file is only created while no sealed value exists.

export type KeySource = { kind: 'env' } | { kind: 'file'; path: string };

export type LoadKeysResult =
  | { ok: true; keys: MasterKey[]; source: KeySource }
  | { ok: false; reason: 'missing'; source: KeySource }
  | { ok: false; reason: 'invalid'; message: string };

export async function loadMasterKeys(keyFile: string, env: NodeJS.ProcessEnv = process.env): Promise<LoadKeysResult> {
  const fromEnv = env.KEEL_MASTER_KEY;
  if (fromEnv !== undefined && fromEnv.trim() !== '') {
    const parsed = parseMasterKeyList(fromEnv);
    if (!parsed.ok) return { ok: false, reason: 'invalid', message: `KEEL_MASTER_KEY: ${parsed.error}` };
    return { ok: true, keys: parsed.keys, source: { kind: 'env' } };
  }
  const source: KeySource = { kind: 'file', path: keyFile };
  const file = await readKeyFile(keyFile);
  if (file.ok) return { ok: true, keys: file.keys, source };
  switch (file.reason) {
    case 'missing':
      return { ok: false, reason: 'missing', source };
    case 'invalid':
      return { ok: false, reason: 'invalid', message: `master key file ${keyFile}: ${file.error}` };
    case 'insecure_permissions':
      return {
        ok: false,
        reason: 'invalid',
        message: `master key file ${keyFile}: mode ${file.mode.toString(8)} lets other users read it; run chmod 600 ${keyFile}`,
      };
  }
}

const keyIdRow = z.object({ key_id: z.string() });

async function requiredKeyIds(db: CommonQueryMethods): Promise<readonly string[]> {
  return db.anyFirst(sql.type(keyIdRow)`SELECT key_id FROM sealing_keys WHERE retired_at IS NULL ORDER BY created_at`);
}

export async function anySealedValueExists(db: CommonQueryMethods): Promise<boolean> {
  const checks = SEALED_COLUMNS.map(
    (column) =>
      sql.fragment`EXISTS (SELECT 1 FROM ${sql.identifier([column.table])} WHERE ${sql.identifier([column.column])} IS NOT NULL)`,
  );
  return db.oneFirst(sql.type(z.object({ any: z.boolean() }))`SELECT (${sql.join(checks, sql.fragment` OR `)}) AS any`);
}

async function registerActiveKey(db: CommonQueryMethods, keyId: string): Promise<void> {
  // A process that seals with a key makes that key required again, even if a rotation retired it.
  await db.query(sql.unsafe`
    INSERT INTO sealing_keys (key_id) VALUES (${keyId})
    ON CONFLICT (key_id) DO UPDATE SET retired_at = NULL`);
}

export type PrepareSealingResult =
  | { ok: true; sealer: Sealer; created: boolean; source: KeySource }
  | { ok: false; message: string };

/**
 * Start-up check for sealing: loads the master keys, refuses to run when the database holds values
 * sealed under a key that is not available (naming its id), creates the key file only for a
 * database without sealed values, and registers the active key.
 */
export async function prepareSealing(pool: DatabasePool, keyFile: string, env: NodeJS.ProcessEnv = process.env): Promise<PrepareSealingResult> {
  const loaded = await loadMasterKeys(keyFile, env);
  if (!loaded.ok && loaded.reason === 'invalid') return { ok: false, message: loaded.message };

  let keys: MasterKey[];
  let created = false;
  let source: KeySource;
  if (loaded.ok) {
    keys = loaded.keys;
    source = loaded.source;
  } else {
    source = loaded.source;
    const needed = await requiredKeyIds(pool);
    if (await anySealedValueExists(pool)) {
      return {
        ok: false,
        message: `the database holds sealed values and no master key was given: provide key ${needed.join(', ') || '(unknown id)'} through KEEL_MASTER_KEY or the key file ${keyFile}; Keel never creates a new key over existing data`,
      };
    }
    const fresh = generateMasterKey();
    const made = await createKeyFileExclusive(keyFile, fresh);
    if (made.ok) {
      keys = [fresh];
      created = true;
    } else {
      // Another process created it first: use that one.
      const again = await readKeyFile(keyFile);
      if (!again.ok) return { ok: false, message: `master key file ${keyFile} could not be read after creation (${again.reason})` };
      keys = again.keys;
    }
    // Keys registered earlier guard no value (none exists), so they are no longer required.
    await pool.query(sql.unsafe`UPDATE sealing_keys SET retired_at = now() WHERE retired_at IS NULL`);
  }

  const ring = new MasterKeyRing(keys);
  const needed = await requiredKeyIds(pool);
  const missing = needed.filter((id) => !ring.byId(id));
  if (missing.length > 0) {
    if (await anySealedValueExists(pool)) {
      return {
        ok: false,
        message: `the database holds values sealed with master key ${missing.join(', ')}, which ${source.kind === 'env' ? 'KEEL_MASTER_KEY' : `the key file ${keyFile}`} does not contain (it has ${ring.keys.map((key) => key.id).join(', ')}); provide that key`,
      };
    }
    await pool.query(sql.unsafe`UPDATE sealing_keys SET retired_at = now() WHERE key_id = ANY(${sql.array(missing, 'text')})`);
  }
  await registerActiveKey(pool, ring.active.id);
  return { ok: true, sealer: createSealer(ring), created, source };
}

export type RotationProgress = { table: string; column: string; rewrapped: number };
export type RotateResult =
  | { ok: true; activeKeyId: string; resumed: boolean; rewrapped: number; retired: string[] }
  | { ok: false; message: string };

const sealedRow = z.object({ keys: z.array(z.string()), value: z.instanceof(Buffer) });
const remainingRow = z.object({ key_id: z.string(), n: z.number() });

/**
 * Adds a new master key (key file) or takes the first key of KEEL_MASTER_KEY as the new one, then
 * rewraps every sealed value's data key in batches, each batch its own transaction. Interrupted, it
 * resumes: values already under the active key are skipped, and a key file that already starts
 * with an unfinished rotation's key is not given another one. Old keys stay in the key file so
 * values sealed by processes started before the rotation stay readable. An old key is retired (no
 * longer required at start) only when no sealed value names it any more: values that could not be
 * rewrapped (rows locked at the time) make the rotation report failure and keep their key required
 * until a later run finishes.
 */
export async function rotateMasterKey(
  pool: DatabasePool,
  keyFile: string,
  options: { env?: NodeJS.ProcessEnv; batchSize?: number; onProgress?: (progress: RotationProgress) => void } = {},
): Promise<RotateResult> {
  const env = options.env ?? process.env;
  const batchSize = options.batchSize ?? 500;
  const loaded = await loadMasterKeys(keyFile, env);
  if (!loaded.ok) {
    return { ok: false, message: loaded.reason === 'invalid' ? loaded.message : `no master key found at ${keyFile} or in KEEL_MASTER_KEY` };
  }
  let keys = loaded.keys;
  const needed = await requiredKeyIds(pool);
  const unfinished = needed.some((id) => id !== keys[0]!.id);
  // A rotation to this key already began if the key is registered, or if the key file already
  // starts with a key the database does not require alone (only a rotation writes one there). With
  // KEEL_MASTER_KEY="<new>,<old>" the first run is a fresh rotation, not a resumed one.
  const resumed = unfinished && (loaded.source.kind === 'file' || needed.includes(keys[0]!.id));
  if (!unfinished) {
    if (loaded.source.kind === 'env') {
      return {
        ok: false,
        message: 'with KEEL_MASTER_KEY, put the new key first: KEEL_MASTER_KEY="<new>,<old>" (make one with `keel keys generate`), then run `keel keys rotate`',
      };
    }
    const fresh = generateMasterKey();
    keys = [fresh, ...keys];
    await writeKeyFile(keyFile, keys);
  }
  const ring = new MasterKeyRing(keys);
  const missing = needed.filter((id) => !ring.byId(id));
  if (missing.length > 0) return { ok: false, message: `cannot rotate: master key ${missing.join(', ')} is required but not available` };
  await registerActiveKey(pool, ring.active.id);

  const activeBytes = Buffer.from(ring.active.id, 'hex');
  const notUnderActive = (column: SealedColumn) =>
    sql.fragment`${sql.identifier([column.column])} IS NOT NULL
      AND substring(${sql.identifier([column.column])} from 2 for 8) <> ${sql.binary(activeBytes)}`;
  let total = 0;
  for (const column of SEALED_COLUMNS) {
    let rewrapped = 0;
    // Walk the table once in key order: restarting every batch from the top would rescan all the
    // rows already rewrapped, which makes a rotation quadratic in the table size.
    let after: string[] | null = null;
    // Page and update on the raw key columns (index order); ::text only builds the seal context.
    const keyText = sql.join(column.keyColumns.map((key) => sql.fragment`${sql.identifier([key])}::text`), sql.fragment`, `);
    const keyRaw = sql.join(column.keyColumns.map((key) => sql.identifier([key])), sql.fragment`, `);
    for (;;) {
      const batch = await pool.transaction(async (transaction) => {
        const rows = await transaction.any(sql.type(sealedRow)`
          SELECT ARRAY[${keyText}] AS keys,
            ${sql.identifier([column.column])} AS value
          FROM ${sql.identifier([column.table])}
          WHERE ${notUnderActive(column)}
            ${after === null ? sql.fragment`` : sql.fragment`AND (${keyRaw}) > (${sql.join(after, sql.fragment`, `)})`}
          ORDER BY ${keyRaw}
          LIMIT ${batchSize} FOR UPDATE SKIP LOCKED`);
        for (const row of rows) {
          const rowId = row.keys.join('/');
          const context = { table: column.table, column: column.column, rowId };
          const result = rewrapSealed(ring, context, row.value);
          if (!result.ok) {
            throw new Error(`${column.table}.${column.column} row ${rowId}: cannot rewrap (${result.reason}${result.reason === 'unknown_key' ? ` ${result.keyId}` : ''})`);
          }
          await transaction.query(sql.unsafe`
            UPDATE ${sql.identifier([column.table])} SET ${sql.identifier([column.column])} = ${sql.binary(result.sealed)}
            WHERE ${sql.join(
              column.keyColumns.map((key, index) => sql.fragment`${sql.identifier([key])} = ${row.keys[index]!}`),
              sql.fragment` AND `,
            )}`);
        }
        return rows;
      }).catch((error: Error) => error);
      if (batch instanceof Error) return { ok: false, message: batch.message };
      if (batch.length === 0) break;
      after = batch[batch.length - 1]!.keys;
      rewrapped += batch.length;
      options.onProgress?.({ table: column.table, column: column.column, rewrapped });
    }
    total += rewrapped;
  }

  // A row locked by a running transition was skipped, and a process started before the rotation may
  // still seal with the old key: a key only stops being required once no value names it. Otherwise
  // starting without it would open the database with values nobody can read.
  const remaining = await pool.any(sql.type(remainingRow)`
    SELECT key_id, count(*)::int AS n FROM (
      ${sql.join(
        SEALED_COLUMNS.map(
          (column) => sql.fragment`
            SELECT encode(substring(${sql.identifier([column.column])} from 2 for 8), 'hex') AS key_id
            FROM ${sql.identifier([column.table])} WHERE ${notUnderActive(column)}`,
        ),
        sql.fragment` UNION ALL `,
      )}
    ) AS left_behind GROUP BY key_id ORDER BY key_id`);
  if (remaining.length > 0) {
    const listed = remaining.map((row) => `${row.n} under ${row.key_id}`).join(', ');
    return {
      ok: false,
      message: `rewrapped ${total} value(s) to master key ${ring.active.id}, but ${listed} could not be rewrapped now (rows busy, or written by a process still running with an old key); those keys stay required: restart running Keel processes and run \`keel keys rotate\` again to finish`,
    };
  }
  const retired = await pool.anyFirst(sql.type(keyIdRow)`
    UPDATE sealing_keys SET retired_at = now() WHERE key_id <> ${ring.active.id} AND retired_at IS NULL RETURNING key_id`);
  return { ok: true, activeKeyId: ring.active.id, resumed, rewrapped: total, retired: [...retired] };
}
