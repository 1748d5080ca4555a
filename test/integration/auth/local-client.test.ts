import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'slonik';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { authenticateToken, createClient, listClients, revokeClient } from '../../../src/auth/client-repository.js';
import { ensureLocalClient, type LocalClientResult } from '../../../src/auth/local-client.js';
import { createDatabasePool } from '../../../src/db/pool.js';
import { silentLogger } from '../../../src/log/logger.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { testConfig } from '../../support/test-keel.js';

// The first start of an installation creates the client `local`, prints its token once and writes
// it to dataDir/local-client.token, so the quick start can call the default agent right away.

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
});

async function freshDatabase(): Promise<TestDatabase> {
  const database = await createTestDatabase();
  cleanups.push(database.drop);
  return database;
}

function printer(): { write: (text: string) => void; lines: string[] } {
  const lines: string[] = [];
  return { lines, write: (text) => lines.push(text) };
}

const TOKEN_LINE = /^keel: created client "local"; its token \(shown once, also in (.+)\): (keel_[A-Za-z0-9_-]{43})\n$/;

describe('ensureLocalClient', () => {
  it('creates local on the first start, writes the token file (0600) and prints the token once', async () => {
    const database = await freshDatabase();
    const config = testConfig(database.url);
    const out = printer();
    const result = await ensureLocalClient(database.pool, config, silentLogger(), { write: out.write });
    const tokenFile = join(config.dataDir, 'local-client.token');
    expect(result).toMatchObject({ action: 'created', client: { name: 'local' }, tokenFile, fileWritten: true });

    expect(out.lines).toHaveLength(1);
    const match = TOKEN_LINE.exec(out.lines[0]!);
    expect(match, out.lines[0]).not.toBeNull();
    expect(match![1]).toBe(tokenFile);
    const token = match![2]!;
    expect(readFileSync(tokenFile, 'utf8')).toBe(`${token}\n`);
    expect(statSync(tokenFile).mode & 0o777).toBe(0o600);
    expect(await authenticateToken(database.pool, token)).toEqual({ ok: true, client: { id: (result as { client: { id: string } }).client.id, name: 'local' } });

    // Second start: nothing happens, nothing printed, the file untouched.
    const again = printer();
    expect(await ensureLocalClient(database.pool, config, silentLogger(), { write: again.write })).toEqual({ action: 'skipped', reason: 'clients_exist' });
    expect(again.lines).toEqual([]);
    expect(readFileSync(tokenFile, 'utf8')).toBe(`${token}\n`);
    expect((await listClients(database.pool, { includeRevoked: true })).map((client) => client.name)).toEqual(['local']);
  });

  it('creates the data directory when it does not exist yet (external database)', async () => {
    const database = await freshDatabase();
    const base = testConfig(database.url);
    const config = { ...base, dataDir: join(base.dataDir, 'not', 'yet') };
    const result = await ensureLocalClient(database.pool, config, silentLogger(), { write: () => undefined });
    expect(result).toMatchObject({ action: 'created', fileWritten: true });
    expect(statSync(join(config.dataDir, 'local-client.token')).mode & 0o777).toBe(0o600);
  });

  it('two (and more) concurrent bootstraps create exactly one client', async () => {
    const database = await freshDatabase();
    const config = testConfig(database.url);
    const pools = await Promise.all(Array.from({ length: 4 }, () => createDatabasePool(database.url, { maximumPoolSize: 2 })));
    try {
      const out = printer();
      const results: LocalClientResult[] = await Promise.all(pools.map((pool) => ensureLocalClient(pool, config, silentLogger(), { write: out.write })));
      expect(results.filter((result) => result.action === 'created')).toHaveLength(1);
      for (const result of results.filter((r) => r.action !== 'created')) {
        expect(result).toEqual({ action: 'skipped', reason: expect.stringMatching(/^(lost_race|clients_exist)$/) });
      }
      expect(out.lines).toHaveLength(1);
      const rows = await database.pool.anyFirst(sql.type(z.object({ name: z.string() }))`SELECT name FROM clients WHERE name = 'local'`);
      expect(rows).toEqual(['local']);
      const token = TOKEN_LINE.exec(out.lines[0]!)![2]!;
      expect(readFileSync(join(config.dataDir, 'local-client.token'), 'utf8')).toBe(`${token}\n`);
    } finally {
      await Promise.all(pools.map((pool) => pool.end()));
    }
  });

  it('leaves an existing token file alone and still prints the new token', async () => {
    const database = await freshDatabase();
    const config = testConfig(database.url);
    const tokenFile = join(config.dataDir, 'local-client.token');
    writeFileSync(tokenFile, 'previous content\n', { mode: 0o600 });
    const out = printer();
    const result = await ensureLocalClient(database.pool, config, silentLogger(), { write: out.write });
    expect(result).toMatchObject({ action: 'created', fileWritten: false, fileProblem: 'the file exists already and was left unchanged' });
    expect(readFileSync(tokenFile, 'utf8')).toBe('previous content\n');
    expect(out.lines[0]).toMatch(/^keel: created client "local"; its token \(shown once, not written to .+: the file exists already and was left unchanged\): keel_[A-Za-z0-9_-]{43}\n$/);
  });

  it('does nothing when a client exists already, even if every client is revoked', async () => {
    const database = await freshDatabase();
    const config = testConfig(database.url);
    const ci = await createClient(database.pool, 'ci');
    expect(ci.ok).toBe(true);
    const out = printer();
    expect(await ensureLocalClient(database.pool, config, silentLogger(), { write: out.write })).toEqual({ action: 'skipped', reason: 'clients_exist' });
    await revokeClient(database.pool, 'ci');
    expect(await ensureLocalClient(database.pool, config, silentLogger(), { write: out.write })).toEqual({ action: 'skipped', reason: 'clients_exist' });
    expect(out.lines).toEqual([]);
    expect(existsSync(join(config.dataDir, 'local-client.token'))).toBe(false);
  });

  it('under auth.mode none: no local client, no file; the anonymous row is ensured', async () => {
    const database = await freshDatabase();
    const config = testConfig(database.url, { KEEL_AUTH_MODE: 'none' });
    expect(config.auth.mode).toBe('none');
    await database.pool.query(sql.unsafe`DELETE FROM clients`);
    const out = printer();
    expect(await ensureLocalClient(database.pool, config, silentLogger(), { write: out.write })).toEqual({ action: 'skipped', reason: 'auth_none' });
    expect(out.lines).toEqual([]);
    expect(existsSync(join(config.dataDir, 'local-client.token'))).toBe(false);
    expect(await database.pool.anyFirst(sql.type(z.object({ name: z.string() }))`SELECT name FROM clients`)).toEqual(['anonymous']);
  });

  it('reports a database failure as a value', async () => {
    const database = await freshDatabase();
    const config = testConfig(database.url);
    await database.pool.query(sql.unsafe`ALTER TABLE clients RENAME TO clients_elsewhere`);
    const result = await ensureLocalClient(database.pool, config, silentLogger(), { write: () => undefined });
    expect(result).toMatchObject({ action: 'failed', message: expect.stringContaining('cannot prepare the client "local"') });
  });
});
