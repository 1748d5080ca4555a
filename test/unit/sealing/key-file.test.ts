import { chmod, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, it, expect } from 'vitest';
import { createKeyFileExclusive, readKeyFile, writeKeyFile } from '../../../src/sealing/key-file.js';
import { encodeMasterKey, generateMasterKey } from '../../../src/sealing/master-key.js';

// Mode bits are not enforced for root on some CI images, but stat still reports them, which is all
// these tests look at.
let dir: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'keel-key-file-'));
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('writeKeyFile / readKeyFile', () => {
  it('round-trips a key list, active key first, one base64 key per line', async () => {
    const keys = [generateMasterKey(), generateMasterKey(), generateMasterKey()];
    const path = join(dir, 'master.key');
    await writeKeyFile(path, keys);
    expect(await readFile(path, 'utf8')).toBe(keys.map((k) => `${encodeMasterKey(k)}\n`).join(''));
    expect(await readKeyFile(path)).toEqual({ ok: true, keys });
  });

  it('writes mode 0600, creates a missing parent directory with mode 0700 and leaves no temp file', async () => {
    const path = join(dir, 'nested', 'deeper', 'master.key');
    await writeKeyFile(path, [generateMasterKey()]);
    expect((await stat(path)).mode & 0o777).toBe(0o600);
    expect((await stat(join(dir, 'nested'))).mode & 0o777).toBe(0o700);
    expect((await stat(join(dir, 'nested', 'deeper'))).mode & 0o777).toBe(0o700);
    expect(await readdir(join(dir, 'nested', 'deeper'))).toEqual(['master.key']);
  });

  it('replaces an existing file, resetting loose permissions to 0600', async () => {
    const path = join(dir, 'master.key');
    await writeFile(path, 'old', { mode: 0o644 });
    await chmod(path, 0o644);
    const keys = [generateMasterKey(), generateMasterKey()];
    await writeKeyFile(path, keys);
    expect((await stat(path)).mode & 0o777).toBe(0o600);
    expect(await readKeyFile(path)).toEqual({ ok: true, keys });
  });

  it('refuses to write an empty key list', async () => {
    await expect(writeKeyFile(join(dir, 'master.key'), [])).rejects.toThrow(RangeError);
  });

  it('reports a missing file', async () => {
    expect(await readKeyFile(join(dir, 'absent.key'))).toEqual({ ok: false, reason: 'missing' });
  });

  it.each([0o640, 0o604, 0o660, 0o620, 0o601])('refuses a key file with mode %o', async (mode) => {
    const path = join(dir, 'master.key');
    await writeKeyFile(path, [generateMasterKey()]);
    await chmod(path, mode);
    expect(await readKeyFile(path)).toEqual({ ok: false, reason: 'insecure_permissions', mode });
  });

  it('accepts a read-only owner file (0400)', async () => {
    const path = join(dir, 'master.key');
    const keys = [generateMasterKey()];
    await writeKeyFile(path, keys);
    await chmod(path, 0o400);
    expect(await readKeyFile(path)).toEqual({ ok: true, keys });
  });

  it('reports invalid content with the parse error, and a directory as invalid', async () => {
    const path = join(dir, 'master.key');
    await writeFile(path, `# hand-edited\n${encodeMasterKey(generateMasterKey())}\nshort\n`, { mode: 0o600 });
    const result = await readKeyFile(path);
    expect(result).toMatchObject({ ok: false, reason: 'invalid' });
    if (!result.ok && result.reason === 'invalid') expect(result.error).toMatch(/^key 2: /);

    await writeFile(path, '', { mode: 0o600 });
    expect(await readKeyFile(path)).toEqual({ ok: false, reason: 'invalid', error: 'no master key given' });

    expect(await readKeyFile(dir)).toMatchObject({ ok: false, reason: 'invalid' });
  });
});

describe('createKeyFileExclusive', () => {
  it('creates a 0600 file holding the key, then refuses to overwrite it', async () => {
    const path = join(dir, 'sub', 'master.key');
    const key = generateMasterKey();
    expect(await createKeyFileExclusive(path, key)).toEqual({ ok: true });
    expect((await stat(path)).mode & 0o777).toBe(0o600);
    expect((await stat(join(dir, 'sub'))).mode & 0o777).toBe(0o700);
    expect(await readKeyFile(path)).toEqual({ ok: true, keys: [key] });

    expect(await createKeyFileExclusive(path, generateMasterKey())).toEqual({ ok: false, reason: 'exists' });
    expect(await readKeyFile(path)).toEqual({ ok: true, keys: [key] });
    expect(await readdir(join(dir, 'sub'))).toEqual(['master.key']);
  });

  it('lets exactly one of several concurrent creators win, and the file holds the winner key', async () => {
    for (let round = 0; round < 10; round += 1) {
      const path = join(dir, `race-${round}`, 'master.key');
      const keys = Array.from({ length: 2 + (round % 4) }, () => generateMasterKey());
      const results = await Promise.all(keys.map((k) => createKeyFileExclusive(path, k)));
      const winners = results.flatMap((r, i) => (r.ok ? [keys[i]] : []));
      expect(winners).toHaveLength(1);
      expect(results.filter((r) => !r.ok)).toEqual(Array(keys.length - 1).fill({ ok: false, reason: 'exists' }));
      expect(await readKeyFile(path)).toEqual({ ok: true, keys: winners });
    }
  });

  it('never shows a racing reader an empty or partial file', async () => {
    const path = join(dir, 'master.key');
    const key = generateMasterKey();
    const create = createKeyFileExclusive(path, key);
    const reads = [];
    for (let i = 0; i < 50; i += 1) reads.push(readKeyFile(path));
    await create;
    for (const r of await Promise.all(reads)) {
      expect([{ ok: false, reason: 'missing' }, { ok: true, keys: [key] }]).toContainEqual(r);
    }
  });
});
