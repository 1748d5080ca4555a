import { testClaim, testHolder } from '../../support/run-helpers.js';
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { sql, type DatabasePool } from 'slonik';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { claimQueuedRun, createRun, queuedRequestContext, suspendedStateContext, suspendRun } from '../../../src/runs/run-repository.js';
import { openJson, SEALED_HEADER_BYTES } from '../../../src/sealing/envelope.js';
import { readKeyFile, writeKeyFile } from '../../../src/sealing/key-file.js';
import { encodeMasterKey, generateMasterKey, MasterKeyRing, type MasterKey } from '../../../src/sealing/master-key.js';
import { anySealedValueExists, prepareSealing, rotateMasterKey } from '../../../src/sealing/master-key-store.js';
import type { Sealer } from '../../../src/sealing/sealer.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { tempDir } from '../../support/test-keel.js';

// Master keys against a real database: where the key comes from, when Keel refuses to start, and
// rotation (complete, interrupted, with keys from the environment). Every test takes a fresh
// database and a key file path in a fresh temp directory, so no test depends on another.

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
});

async function freshDatabase(): Promise<TestDatabase> {
  const database = await createTestDatabase();
  cleanups.push(database.drop);
  return database;
}

/** A key file path whose directory does not exist yet. */
function keyFilePath(): string {
  const dir = tempDir('keel-keys-');
  cleanups.push(async () => rmSync(dir, { recursive: true, force: true }));
  return join(dir, 'data', 'master.key');
}

const NO_ENV: NodeJS.ProcessEnv = {};
const envKeys = (...keys: MasterKey[]): NodeJS.ProcessEnv => ({ KEEL_MASTER_KEY: keys.map(encodeMasterKey).join(',') });

async function prepared(pool: DatabasePool, keyFile: string, env: NodeJS.ProcessEnv = NO_ENV): Promise<Sealer> {
  const result = await prepareSealing(pool, keyFile, env);
  if (!result.ok) throw new Error(result.message);
  return result.sealer;
}

type Expected = Map<string, { request: unknown; state?: unknown }>;

/** Creates `runs` runs (sealed queued_request), the first `suspended` of them claimed and suspended (sealed suspended_state). */
async function populate(pool: DatabasePool, sealer: Sealer, runs: number, suspended: number): Promise<Expected> {
  const expected: Expected = new Map();
  for (let n = 0; n < runs; n += 1) {
    const request = { text: `request ${n}`, n, secret: randomBytes(12).toString('base64'), nested: { list: [n, 'x', null] } };
    const run = await createRun(pool, sealer, { agent: 'echo', auditLevel: 'full', answerLevel: 'full', request });
    expected.set(run.id, { request });
  }
  for (const [id, entry] of [...expected].slice(0, suspended)) {
    expect(await claimQueuedRun(pool, id, testClaim('w1'))).not.toBeNull();
    const state = { transcript: [{ role: 'user', text: `hello ${id}` }], pending: { tool: 'search', args: { q: id } } };
    expect(await suspendRun(pool, sealer, id, testHolder('w1'), 'waiting_for_approval', state)).not.toBeNull();
    entry.state = state;
  }
  return expected;
}

const sealedRow = z.object({
  id: z.string(),
  queued_key: z.string().nullable(),
  suspended_key: z.string().nullable(),
  queued_request: z.instanceof(Buffer).nullable(),
  suspended_state: z.instanceof(Buffer).nullable(),
});
type SealedRow = z.infer<typeof sealedRow>;

async function sealedRows(pool: DatabasePool): Promise<readonly SealedRow[]> {
  return pool.any(sql.type(sealedRow)`
    SELECT id::text AS id,
      encode(substring(queued_request from 2 for 8), 'hex') AS queued_key,
      encode(substring(suspended_state from 2 for 8), 'hex') AS suspended_key,
      queued_request, suspended_state
    FROM runs ORDER BY id`);
}

/** How many sealed values each master key id wraps. */
async function valuesByKey(pool: DatabasePool): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (const row of await sealedRows(pool)) {
    for (const keyId of [row.queued_key, row.suspended_key]) {
      if (keyId !== null) counts[keyId] = (counts[keyId] ?? 0) + 1;
    }
  }
  return counts;
}

/** Every sealed value opens with exactly `ring` and equals what was sealed. */
async function expectAllOpen(pool: DatabasePool, ring: MasterKeyRing, expected: Expected): Promise<void> {
  const rows = await sealedRows(pool);
  expect(rows.map((row) => row.id).sort()).toEqual([...expected.keys()].sort());
  for (const row of rows) {
    const want = expected.get(row.id)!;
    expect(openJson(ring, queuedRequestContext(row.id), row.queued_request!)).toEqual({ ok: true, value: want.request });
    if (want.state === undefined) {
      expect(row.suspended_state).toBeNull();
    } else {
      expect(openJson(ring, suspendedStateContext(row.id), row.suspended_state!)).toEqual({ ok: true, value: want.state });
    }
  }
}

const keyRow = z.object({ key_id: z.string(), retired: z.boolean() });
async function sealingKeys(pool: DatabasePool): Promise<Record<string, 'required' | 'retired'>> {
  const rows = await pool.any(sql.type(keyRow)`SELECT key_id, retired_at IS NOT NULL AS retired FROM sealing_keys`);
  return Object.fromEntries(rows.map((row) => [row.key_id, row.retired ? 'retired' : 'required']));
}

async function keyFileIds(keyFile: string): Promise<string[]> {
  const file = await readKeyFile(keyFile);
  if (!file.ok) throw new Error(`key file ${keyFile}: ${file.reason}`);
  return file.keys.map((key) => key.id);
}

describe('prepareSealing: where the master key comes from', () => {
  it('first start without a key creates a 0600 key file and registers the key; the next start reads the same key', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    expect(existsSync(keyFile)).toBe(false);

    const first = await prepareSealing(pool, keyFile, NO_ENV);
    expect(first).toMatchObject({ ok: true, created: true, source: { kind: 'file', path: keyFile } });
    if (!first.ok) return;
    expect(statSync(keyFile).mode & 0o777).toBe(0o600);
    expect(await keyFileIds(keyFile)).toEqual([first.sealer.activeKeyId]);
    expect(await sealingKeys(pool)).toEqual({ [first.sealer.activeKeyId]: 'required' });

    const second = await prepareSealing(pool, keyFile, NO_ENV);
    expect(second).toMatchObject({ ok: true, created: false, source: { kind: 'file', path: keyFile } });
    if (!second.ok) return;
    expect(second.sealer.activeKeyId).toBe(first.sealer.activeKeyId);
    // What one start sealed, the next one opens.
    const expected = await populate(pool, first.sealer, 2, 1);
    await expectAllOpen(pool, second.sealer.ring, expected);
  });

  it('with KEEL_MASTER_KEY set, uses it and creates no key file', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const key = generateMasterKey();
    const result = await prepareSealing(pool, keyFile, envKeys(key));
    expect(result).toMatchObject({ ok: true, created: false, source: { kind: 'env' } });
    expect(result.ok && result.sealer.activeKeyId).toBe(key.id);
    expect(existsSync(keyFile)).toBe(false);
    expect(await sealingKeys(pool)).toEqual({ [key.id]: 'required' });
  });

  it('refuses a database with sealed values when no key is available, names the key it needs and creates no key file', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const sealer = await prepared(pool, keyFile);
    await populate(pool, sealer, 3, 1);
    rmSync(keyFile);

    for (const env of [NO_ENV, { KEEL_MASTER_KEY: '  ' }]) {
      const result = await prepareSealing(pool, keyFile, env);
      expect(result.ok).toBe(false);
      if (result.ok) return;
      expect(result.message).toContain(sealer.activeKeyId);
      expect(result.message).toMatch(/never creates a new key/);
      expect(existsSync(keyFile)).toBe(false);
    }
    expect(await sealingKeys(pool)).toEqual({ [sealer.activeKeyId]: 'required' });
  });

  it('refuses a database with sealed values under another key, naming the key it needs; the wrong key fails closed', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const sealer = await prepared(pool, keyFile);
    const expected = await populate(pool, sealer, 3, 1);
    const other = generateMasterKey();

    const result = await prepareSealing(pool, keyFile, envKeys(other));
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.message).toContain(sealer.activeKeyId);
    expect(result.message).toContain('KEEL_MASTER_KEY');
    // The refusal registered nothing: the other key did not become "required".
    expect(await sealingKeys(pool)).toEqual({ [sealer.activeKeyId]: 'required' });

    const [row] = await sealedRows(pool);
    const context = queuedRequestContext(row!.id);
    expect(openJson(new MasterKeyRing([other]), context, row!.queued_request!)).toEqual({ ok: false, reason: 'unknown_key', keyId: sealer.activeKeyId });
    // A forged ring that claims the right id with other key bytes fails authentication, never yields bytes.
    const forged = new MasterKeyRing([{ id: sealer.activeKeyId, key: other.key }]);
    expect(openJson(forged, context, row!.queued_request!)).toEqual({ ok: false, reason: 'authentication_failed' });
    // The right key still opens everything.
    await expectAllOpen(pool, sealer.ring, expected);
  });

  it('refuses a key file other users can read, with a message saying how to fix it', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const key = generateMasterKey();
    await writeKeyFile(keyFile, [key]);
    chmodSync(keyFile, 0o644);

    const result = await prepareSealing(pool, keyFile, NO_ENV);
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.message).toContain(keyFile);
    expect(result.message).toMatch(/mode 644/);
    expect(result.message).toContain(`chmod 600 ${keyFile}`);
    // Nothing replaced or registered: the operator's file is left as it was.
    expect(readFileSync(keyFile, 'utf8')).toBe(`${encodeMasterKey(key)}\n`);
    expect(await sealingKeys(pool)).toEqual({});

    chmodSync(keyFile, 0o600);
    expect(await prepareSealing(pool, keyFile, NO_ENV)).toMatchObject({ ok: true, created: false });
  });

  it('refuses an unparsable KEEL_MASTER_KEY without echoing it', async () => {
    const { pool } = await freshDatabase();
    const result = await prepareSealing(pool, keyFilePath(), { KEEL_MASTER_KEY: 'not-a-key-at-all' });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.message).toMatch(/^KEEL_MASTER_KEY: /);
    expect(result.message).not.toContain('not-a-key-at-all');
  });
});

describe('rotateMasterKey', () => {
  it('with a key file: adds a key, rewraps every value in batches, and leaves everything readable with only the new key', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const sealer = await prepared(pool, keyFile);
    const oldKey = sealer.ring.active;
    const expected = await populate(pool, sealer, 50, 8);
    const total = 50 + 8;
    const before = new Map((await sealedRows(pool)).map((row) => [row.id, row]));
    expect(await valuesByKey(pool)).toEqual({ [oldKey.id]: total });

    const progress: number[] = [];
    const result = await rotateMasterKey(pool, keyFile, { env: NO_ENV, batchSize: 7, onProgress: (p) => progress.push(p.rewrapped) });
    expect(result).toMatchObject({ ok: true, resumed: false, rewrapped: total, retired: [oldKey.id] });
    if (!result.ok) return;
    const newId = result.activeKeyId;
    expect(newId).not.toBe(oldKey.id);
    // Batches of at most 7, each its own step.
    expect(progress.length).toBeGreaterThanOrEqual(Math.ceil(total / 7));

    expect(await valuesByKey(pool)).toEqual({ [newId]: total });
    expect(await keyFileIds(keyFile)).toEqual([newId, oldKey.id]);
    expect(statSync(keyFile).mode & 0o777).toBe(0o600);
    expect(await sealingKeys(pool)).toEqual({ [oldKey.id]: 'retired', [newId]: 'required' });

    const file = await readKeyFile(keyFile);
    if (!file.ok) throw new Error(file.reason);
    await expectAllOpen(pool, new MasterKeyRing([file.keys[0]!]), expected);
    // Only the wrap changed: data IV, tag and ciphertext are the bytes sealed before the rotation.
    for (const row of await sealedRows(pool)) {
      const old = before.get(row.id)!;
      expect(row.queued_request!.subarray(69)).toEqual(old.queued_request!.subarray(69));
      expect(row.queued_request!.length).toBe(old.queued_request!.length);
      expect(row.queued_request!.length).toBeGreaterThan(SEALED_HEADER_BYTES);
    }

    // After the rotation a start with the key file seals under the new key...
    const restarted = await prepareSealing(pool, keyFile, NO_ENV);
    expect(restarted).toMatchObject({ ok: true, created: false });
    if (!restarted.ok) return;
    expect(restarted.sealer.activeKeyId).toBe(newId);
    const more = await populate(pool, restarted.sealer, 1, 0);
    expect(await valuesByKey(pool)).toEqual({ [newId]: total + 1 });
    await expectAllOpen(pool, new MasterKeyRing([file.keys[0]!]), new Map([...expected, ...more]));

    // ...a start with only the old key is refused, naming the new one...
    const oldOnly = await prepareSealing(pool, keyFile, envKeys(oldKey));
    expect(oldOnly.ok).toBe(false);
    expect(oldOnly.ok ? '' : oldOnly.message).toContain(newId);
    // ...and the new key alone is enough, since the old one guards no value any more.
    expect(await prepareSealing(pool, keyFile, envKeys(file.keys[0]!))).toMatchObject({ ok: true });

    // A second rotation adds a third key in front.
    const again = await rotateMasterKey(pool, keyFile, { env: NO_ENV, batchSize: 7 });
    expect(again).toMatchObject({ ok: true, resumed: false, rewrapped: total + 1, retired: [newId] });
    expect(await keyFileIds(keyFile)).toHaveLength(3);
  });

  it('resumes an interrupted rotation without adding another key', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const sealer = await prepared(pool, keyFile);
    const oldKey = sealer.ring.active;
    const expected = await populate(pool, sealer, 30, 5);
    const total = 30 + 5;

    // The process "dies" right after its first batch committed.
    const killed = rotateMasterKey(pool, keyFile, {
      env: NO_ENV,
      batchSize: 7,
      onProgress: () => {
        throw new Error('killed mid-rotation');
      },
    });
    await expect(killed).rejects.toThrow('killed mid-rotation');

    const [newId, listedOld] = await keyFileIds(keyFile);
    expect(listedOld).toBe(oldKey.id);
    expect(await valuesByKey(pool)).toEqual({ [newId!]: 7, [oldKey.id]: total - 7 });
    expect(await sealingKeys(pool)).toEqual({ [oldKey.id]: 'required', [newId!]: 'required' });

    // A restart in the middle of a rotation works and seals under the new key.
    const midway = await prepared(pool, keyFile);
    expect(midway.activeKeyId).toBe(newId);
    // Without the old key it would be refused: values under it remain.
    const newKey = (await readKeyFile(keyFile).then((file) => (file.ok ? file.keys[0] : undefined)))!;
    const withoutOld = await prepareSealing(pool, keyFile, envKeys(newKey));
    expect(withoutOld.ok ? '' : withoutOld.message).toContain(oldKey.id);

    const resumed = await rotateMasterKey(pool, keyFile, { env: NO_ENV, batchSize: 7 });
    expect(resumed).toMatchObject({ ok: true, activeKeyId: newId, resumed: true, rewrapped: total - 7, retired: [oldKey.id] });
    expect(await keyFileIds(keyFile)).toEqual([newId, oldKey.id]);
    expect(await valuesByKey(pool)).toEqual({ [newId!]: total });
    expect(await sealingKeys(pool)).toEqual({ [oldKey.id]: 'retired', [newId!]: 'required' });
    await expectAllOpen(pool, new MasterKeyRing([newKey]), expected);
  });

  it('with KEEL_MASTER_KEY: refuses a single key, then rewraps everything to the first key of "<new>,<old>"', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const oldKey = generateMasterKey();
    const newKey = generateMasterKey();
    const sealer = await prepared(pool, keyFile, envKeys(oldKey));
    const expected = await populate(pool, sealer, 20, 4);
    const total = 20 + 4;

    const single = await rotateMasterKey(pool, keyFile, { env: envKeys(oldKey), batchSize: 7 });
    expect(single.ok).toBe(false);
    expect(single.ok ? '' : single.message).toMatch(/put the new key first: KEEL_MASTER_KEY="<new>,<old>"/);
    expect(await valuesByKey(pool)).toEqual({ [oldKey.id]: total });
    expect(existsSync(keyFile)).toBe(false);

    const rotated = await rotateMasterKey(pool, keyFile, { env: envKeys(newKey, oldKey), batchSize: 7 });
    expect(rotated).toEqual({ ok: true, activeKeyId: newKey.id, resumed: false, rewrapped: total, retired: [oldKey.id] });
    expect(await valuesByKey(pool)).toEqual({ [newKey.id]: total });
    expect(existsSync(keyFile)).toBe(false);
    await expectAllOpen(pool, new MasterKeyRing([newKey]), expected);

    const oldOnly = await prepareSealing(pool, keyFile, envKeys(oldKey));
    expect(oldOnly.ok ? '' : oldOnly.message).toContain(newKey.id);
    expect(await prepareSealing(pool, keyFile, envKeys(newKey))).toMatchObject({ ok: true, source: { kind: 'env' } });
  });

  it('does not retire the old key while a value under it was busy (row-locked) during the rotation', async () => {
    const database = await freshDatabase();
    const { pool } = database;
    const keyFile = keyFilePath();
    const sealer = await prepared(pool, keyFile);
    const oldKey = sealer.ring.active;
    const expected = await populate(pool, sealer, 12, 2);
    const busyId = [...expected.keys()][0]!;

    // A worker holds the run row (as a transition under the row lock would) for the whole rotation.
    const worker = new pg.Client({ connectionString: database.url });
    await worker.connect();
    try {
      await worker.query('BEGIN');
      await worker.query('SELECT id FROM runs WHERE id = $1 FOR UPDATE', [busyId]);
      const result = await rotateMasterKey(pool, keyFile, { env: NO_ENV, batchSize: 5 });
      expect(result.ok).toBe(false);
      expect(result.ok ? '' : result.message).toContain(oldKey.id);
      expect(result.ok ? '' : result.message).toMatch(/keel keys rotate/);
      const [newId] = await keyFileIds(keyFile);
      // Both values of the busy row are still under the old key, which therefore stays required.
      expect(await valuesByKey(pool)).toEqual({ [newId!]: 14 - 2, [oldKey.id]: 2 });
      expect(await sealingKeys(pool)).toEqual({ [oldKey.id]: 'required', [newId!]: 'required' });
    } finally {
      await worker.query('COMMIT');
      await worker.end();
    }

    const resumed = await rotateMasterKey(pool, keyFile, { env: NO_ENV, batchSize: 5 });
    expect(resumed).toMatchObject({ ok: true, resumed: true, rewrapped: 2, retired: [oldKey.id] });
    const file = await readKeyFile(keyFile);
    if (!file.ok) throw new Error(file.reason);
    await expectAllOpen(pool, new MasterKeyRing([file.keys[0]!]), expected);
  });

  it('on a database without sealed values just adds a key', async () => {
    const { pool } = await freshDatabase();
    const keyFile = keyFilePath();
    const sealer = await prepared(pool, keyFile);
    expect(await anySealedValueExists(pool)).toBe(false);
    const result = await rotateMasterKey(pool, keyFile, { env: NO_ENV });
    expect(result).toMatchObject({ ok: true, resumed: false, rewrapped: 0, retired: [sealer.activeKeyId] });
    expect(await keyFileIds(keyFile)).toHaveLength(2);
  });
});
