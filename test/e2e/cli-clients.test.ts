import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { authenticateToken } from '../../src/auth/client-repository.js';
import { encodeMasterKey, generateMasterKey } from '../../src/sealing/master-key.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { createTestDatabase, type TestDatabase } from '../support/test-database.js';
import { tempDir } from '../support/test-keel.js';

// `keel clients add|list|revoke` as an operator runs them, in child processes against a fresh
// database: the token on stdout alone, never shown again, and clear errors.

let database: TestDatabase;
let env: NodeJS.ProcessEnv;
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });
const TOKEN = /^keel_[A-Za-z0-9_-]{43}$/;

beforeAll(async () => {
  database = await createTestDatabase();
  env = cleanEnv({ KEEL_DATABASE_URL: database.url, KEEL_MASTER_KEY: encodeMasterKey(generateMasterKey()), KEEL_DATA_DIR: tempDir('keel-data-'), KEEL_LOG_LEVEL: 'warn' });
});
afterAll(async () => database?.drop());

describe('keel clients', () => {
  let ciToken = '';

  it('add prints only the token on stdout, a note on stderr', async () => {
    const added = await keelCli('clients', 'add', 'ci');
    expect(added.code).toBe(0);
    expect(added.stdout).toMatch(/^keel_[A-Za-z0-9_-]{43}\n$/);
    ciToken = added.stdout.trim();
    expect(ciToken).toMatch(TOKEN);
    expect(added.stderr).toMatch(/^keel: created client "ci" \([0-9a-f-]{36}\); its token is shown once and cannot be recovered\n$/);
    expect(added.stderr).not.toContain(ciToken);
    expect(await authenticateToken(database.pool, ciToken)).toMatchObject({ ok: true, client: { name: 'ci' } });
  });

  it('a duplicate name exits non-zero with a clear message and prints no token', async () => {
    const again = await keelCli('clients', 'add', 'ci');
    expect(again.code).toBe(1);
    expect(again.stdout).toBe('');
    expect(again.stderr).toBe('keel: a client named "ci" exists already; revoke it first (keel clients revoke ci) or choose another name\n');
  });

  it('bad names are refused before the database is touched', async () => {
    for (const bad of ['has space', 'a'.repeat(65), 'semi;colon', 'anonymous']) {
      const refused = await keelCli('clients', 'add', bad);
      expect(refused.code, bad).toBe(64);
      expect(refused.stdout).toBe('');
      expect(refused.stderr).toMatch(new RegExp(`^keel: cannot add client ".*": (a client name is 1 to 64 characters|the name "anonymous" is reserved)`));
    }
    const missing = await keelCli('clients', 'add');
    expect(missing.code).toBe(64);
    expect(missing.stderr).toMatch(/missing required argument 'name'/);
  });

  it('list shows the hint, never the token or its hash', async () => {
    const hashHex = await database.pool.oneFirst(sql.type(z.object({ hex: z.string() }))`SELECT encode(token_hash, 'hex') AS hex FROM clients WHERE name = 'ci'`);
    const listed = await keelCli('clients', 'list');
    expect(listed.code).toBe(0);
    const lines = listed.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^NAME\s+ID\s+TOKEN\s+CREATED\s+LAST USED\s+REVOKED$/);
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatch(new RegExp(`^ci\\s+[0-9a-f-]{36}\\s+keel_…${ciToken.slice(-4).replace(/[-]/g, '\\-')}\\s+\\d{4}-\\d\\d-\\d\\dT\\S+Z\\s+\\S+Z\\s+-$`));
    expect(listed.stdout).not.toContain(ciToken.slice(5, -4));
    expect(listed.stdout).not.toContain(hashHex);
    expect(listed.stdout).not.toContain('anonymous');

    const json = await keelCli('clients', 'list', '--json');
    expect(json.code).toBe(0);
    const rows = json.stdout.trimEnd().split('\n').map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(rows).toEqual([
      { id: expect.any(String), name: 'ci', token: `keel_…${ciToken.slice(-4)}`, createdAt: expect.any(String), lastUsedAt: expect.any(String), revokedAt: null },
    ]);
    expect(json.stdout).not.toContain(ciToken.slice(5, -4));
  });

  it('revoke, then list --all shows it revoked and list hides it; revoking again or an unknown client fails', async () => {
    const second = await keelCli('clients', 'add', 'web');
    expect(second.code).toBe(0);
    const webId = JSON.parse((await keelCli('clients', 'list', '--json')).stdout.trimEnd().split('\n')[1]!).id as string;

    const revoked = await keelCli('clients', 'revoke', 'ci');
    expect(revoked.code).toBe(0);
    expect(revoked.stdout).toMatch(/^client "ci" \([0-9a-f-]{36}\) revoked\n$/);
    expect(await authenticateToken(database.pool, ciToken)).toEqual({ ok: false });

    const byId = await keelCli('clients', 'revoke', webId);
    expect(byId.code).toBe(0);
    expect(byId.stdout).toBe(`client "web" (${webId}) revoked\n`);

    const active = await keelCli('clients', 'list');
    expect(active.stdout.trimEnd().split('\n')).toHaveLength(1);
    const all = await keelCli('clients', 'list', '--all');
    const lines = all.stdout.trimEnd().split('\n');
    expect(lines).toHaveLength(3);
    expect(lines[1]).toMatch(/^ci\s.*\s\d{4}-\d\d-\d\dT\S+Z$/);
    expect(lines[2]).toMatch(/^web\s.*\s-\s+\d{4}-\d\d-\d\dT\S+Z$/);
    const allJson = (await keelCli('clients', 'list', '--all', '--json')).stdout.trimEnd().split('\n').map((line) => JSON.parse(line) as { name: string; revokedAt: string | null });
    expect(allJson.map((row) => [row.name, typeof row.revokedAt])).toEqual([['ci', 'string'], ['web', 'string']]);

    const twice = await keelCli('clients', 'revoke', 'ci');
    expect(twice.code).toBe(1);
    expect(twice.stderr).toBe('keel: client "ci" is revoked already\n');
    const unknown = await keelCli('clients', 'revoke', 'nobody');
    expect(unknown.code).toBe(6);
    expect(unknown.stderr).toBe('keel: no client named or with id "nobody"\n');

    // The name is free again once revoked.
    const reused = await keelCli('clients', 'add', 'ci');
    expect(reused.code).toBe(0);
    expect(reused.stdout.trim()).toMatch(TOKEN);
    expect(reused.stdout.trim()).not.toBe(ciToken);
  });
});
