import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MIGRATIONS_DIR } from '../../../src/db/migrate.js';
import { listPushConfigSummaries, maskCredential } from '../../../src/push/push-admin.js';
import { adminSession } from '../../support/operator-ui.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { PUSH_TEST_OVERRIDES, PUSH_TEST_TIMINGS, createPushConfigRpc, newClientToken, rpc, sendWithPush, startReceiver, waitForTerminalEvent, type Receiver } from './push-support.js';

// The mask of push secrets: the scheme and the last four characters (`Bearer …WXYZ`, token
// `…QRST`), except for a secret of eight characters or fewer, which keeps no hint at all: its
// credential is shown by the scheme alone, its token by the mask alone. Everywhere a config is
// shown: the create answer, Get, List, the operator summaries (CLI and UI) and the UI page.

let keel: TestKeel;
let token = '';
let receiver: Receiver;

beforeAll(async () => {
  keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES } });
  token = await newClientToken(keel.context.pool);
  receiver = await startReceiver();
});
afterAll(async () => {
  await receiver?.close();
  await keel?.dispose();
});

// Letters that never occur in a UUID or the page's markup by chance.
const SHORT_CREDENTIAL = 'PQ-RSTUV';
const SHORT_TOKEN = 'WX-YZKLM';

const hintRow = z.object({ id: z.string(), token_hint: z.string().nullable(), credentials_hint: z.string().nullable() });

describe('a secret of eight characters or fewer', () => {
  it('is shown by its scheme alone (token: the mask alone) in the create answer, Get, List, the summaries and the UI', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'short secrets');
    await waitForTerminalEvent(keel.context.pool, taskId);
    const created = await createPushConfigRpc(keel.url, token, 'echo', taskId, {
      id: 'short',
      url: receiver.url,
      token: SHORT_TOKEN,
      authentication: { scheme: 'Bearer', credentials: SHORT_CREDENTIAL },
    });
    const expected = { id: 'short', taskId, url: receiver.url, token: '…', authentication: { scheme: 'Bearer' } };
    expect(created).toEqual(expected);
    expect((await rpc(keel.url, token, 'echo', 'GetTaskPushNotificationConfig', { taskId, id: 'short' })).body.result).toEqual(expected);
    expect((await rpc(keel.url, token, 'echo', 'ListTaskPushNotificationConfigs', { taskId })).body.result.configs).toEqual([expected]);

    // No hint is kept in clear at all.
    const rows = await keel.context.pool.any(sql.type(hintRow)`SELECT id, token_hint, credentials_hint FROM push_configs WHERE task_id = ${taskId}`);
    expect(rows).toEqual([{ id: 'short', token_hint: null, credentials_hint: null }]);

    // What `keel push list|show` and the UI print.
    const summary = (await listPushConfigSummaries(keel.context.pool)).find((row) => row.task_id === taskId && row.id === 'short')!;
    expect(maskCredential(summary.auth_scheme, summary.credentials_hint)).toBe('Bearer');
    const session = await adminSession(keel);
    for (const page of ['/ui/push', `/ui/push/${taskId}/short`]) {
      const html = await (await fetch(`${keel.url}${page}`, { headers: { cookie: session.cookie } })).text();
      expect(html, page).toContain('Bearer');
      for (const secret of [SHORT_CREDENTIAL, SHORT_TOKEN]) expect(html, page).not.toContain(secret.slice(-4));
    }
  });

  it('nine characters and more keep the last four, counted in characters (a surrogate pair is one)', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'longer secrets');
    await waitForTerminalEvent(keel.context.pool, taskId);
    const nine = await createPushConfigRpc(keel.url, token, 'echo', taskId, { id: 'nine', url: receiver.url, token: 'NINE-TOKN', authentication: { scheme: 'Bearer', credentials: 'NINE-CRED' } });
    expect(nine).toMatchObject({ token: '…TOKN', authentication: { scheme: 'Bearer', credentials: '…CRED' } });
    // The last four UTF-16 units of this one start inside the emoji's surrogate pair.
    const emoji = await createPushConfigRpc(keel.url, token, 'echo', taskId, { id: 'emoji', url: receiver.url, authentication: { scheme: 'Bearer', credentials: 'xxxxxxxxx😀xyz' } });
    expect(emoji).toMatchObject({ authentication: { scheme: 'Bearer', credentials: '…😀xyz' } });
  });
});

describe('sql/0010: hints written before the rule', () => {
  it('are cleared wherever the sealed secret may have had eight characters or fewer, and kept where it cannot have', async () => {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'old hints');
    await waitForTerminalEvent(keel.context.pool, taskId);
    const secrets = { six: 'abcdef', eight: 'abcdefgh', thirty: 'a'.repeat(26) + 'WXYZ', sixty: 'b'.repeat(56) + 'QRST' };
    for (const [id, secret] of Object.entries(secrets)) {
      await createPushConfigRpc(keel.url, token, 'echo', taskId, { id, url: receiver.url, token: secret, authentication: { scheme: 'Bearer', credentials: secret } });
    }
    // As the earlier code stored them: the last four characters whatever the length.
    for (const [id, secret] of Object.entries(secrets)) {
      await keel.context.pool.query(sql.unsafe`
        UPDATE push_configs SET token_hint = ${secret.slice(-4)}, credentials_hint = ${secret.slice(-4)} WHERE task_id = ${taskId} AND id = ${id}`);
    }
    const migration = readFileSync(join(MIGRATIONS_DIR, '0010_push_short_secret_hints.sql'), 'utf8');
    const client = new pg.Client({ connectionString: keel.databaseUrl });
    await client.connect();
    try {
      await client.query(migration);
    } finally {
      await client.end();
    }
    const rows = await keel.context.pool.any(sql.type(hintRow)`SELECT id, token_hint, credentials_hint FROM push_configs WHERE task_id = ${taskId} ORDER BY id`);
    expect(rows).toEqual([
      { id: 'eight', token_hint: null, credentials_hint: null },
      { id: 'six', token_hint: null, credentials_hint: null },
      // 30 ASCII characters are 32 bytes of JSON: as long as eight \u-escaped ones could be, so cleared.
      { id: 'sixty', token_hint: 'QRST', credentials_hint: 'QRST' },
      { id: 'thirty', token_hint: null, credentials_hint: null },
    ]);
    expect((await rpc(keel.url, token, 'echo', 'GetTaskPushNotificationConfig', { taskId, id: 'six' })).body.result).toEqual({
      id: 'six',
      taskId,
      url: receiver.url,
      token: '…',
      authentication: { scheme: 'Bearer' },
    });
  });
});
