import { randomBytes } from 'node:crypto';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resumePushConfig } from '../../../src/push/push-admin.js';
import { callA2A, expectA2AResult } from '../../support/a2a-wire.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  capturingLogger,
  configState,
  createPushConfigRpc,
  newClientToken,
  sendWithPush,
  startReceiver,
  waitForSettled,
  type Receiver,
} from './push-support.js';

// A push config's `authentication.credentials` and `token` are secrets of the client: the
// credential is sent only as `Authorization: Bearer <credentials>`, the token never; Get and List
// show both masked (the scheme and the last four characters); neither appears in any log line
// (captured at trace level, without the production logger's redaction), nor in clear in the
// database.

const secret = (label: string) => `${label}-${randomBytes(12).toString('hex')}`;
const credentials = secret('cred');
const pushToken = secret('tok');
const otherCredentials = secret('cred2');
const otherToken = secret('tok2');
const SECRETS = [credentials, pushToken, otherCredentials, otherToken];

const captured = capturingLogger();
let keel: TestKeel;
let token = '';
let receiver: Receiver;

beforeAll(async () => {
  keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES }, logger: captured.logger });
  token = await newClientToken(keel.context.pool);
});
afterAll(async () => {
  await receiver?.close();
  await keel?.dispose();
});

describe('credentials and token', () => {
  let taskId = '';

  it('only Authorization carries the credential; the token is never sent; retries and a pause change nothing', async () => {
    // 503 (retried), then 401 (paused), then 200 after resume: the paths that log.
    let count = 0;
    receiver = await startReceiver(() => {
      count += 1;
      if (count === 1) return { status: 503 };
      if (count === 2) return { status: 401 };
      return { status: 200 };
    });
    ({ taskId } = await sendWithPush(keel.url, token, 'echo', 'with secrets', {
      id: 'secret-hook',
      url: receiver.url,
      token: pushToken,
      authentication: { scheme: 'Bearer', credentials },
    }));
    await waitFor(async () => (await configState(keel.context.pool, taskId, 'secret-hook'))?.state === 'paused', 'the config to pause');
    expect(await resumePushConfig(keel.context, taskId, 'secret-hook')).toMatchObject({ ok: true });
    const rows = await waitForSettled(keel.context.pool, taskId);
    expect(rows.every((row) => row.state === 'delivered')).toBe(true);

    expect(receiver.requests.length).toBeGreaterThanOrEqual(rows.length + 2);
    for (const request of receiver.requests) {
      expect(request.headers.authorization).toBe(`Bearer ${credentials}`);
      expect(request.headers['x-a2a-notification-token']).toBeUndefined();
      for (const [name, value] of Object.entries(request.headers)) {
        const text = Array.isArray(value) ? value.join(', ') : String(value);
        expect(text, `header ${name}`).not.toContain(pushToken);
        if (name !== 'authorization') expect(text, `header ${name}`).not.toContain(credentials);
      }
      expect(request.raw).not.toContain(pushToken);
      expect(request.raw).not.toContain(credentials);
      expect(request.path).not.toContain(pushToken);
    }
  });

  it('without authentication no Authorization header is sent, even with a token', async () => {
    const plain = await startReceiver();
    try {
      const { taskId: plainTask } = await sendWithPush(keel.url, token, 'echo', 'token only', { id: 'token-only', url: plain.url, token: otherToken });
      await waitForSettled(keel.context.pool, plainTask);
      expect(plain.requests.length).toBeGreaterThan(0);
      for (const request of plain.requests) {
        expect(request.headers.authorization).toBeUndefined();
        expect(JSON.stringify(request.headers)).not.toContain(otherToken);
      }
    } finally {
      await plain.close();
    }
  });

  it('Get and List show them masked (scheme and last four characters) on both bindings', async () => {
    await createPushConfigRpc(keel.url, token, 'echo', taskId, {
      id: 'second',
      url: receiver.url,
      token: otherToken,
      authentication: { scheme: 'Bearer', credentials: otherCredentials },
    });
    for (const binding of ['JSONRPC', 'HTTP+JSON'] as const) {
      const got = await callA2A(keel.url, 'echo', binding, 'GetTaskPushNotificationConfig', { taskId, id: 'secret-hook' }, { token });
      const config = expectA2AResult(binding, got);
      expect(config).toMatchObject({
        id: 'secret-hook',
        taskId,
        url: receiver.url,
        token: `…${pushToken.slice(-4)}`,
        authentication: { scheme: 'Bearer', credentials: `…${credentials.slice(-4)}` },
      });
      const listed = await callA2A(keel.url, 'echo', binding, 'ListTaskPushNotificationConfigs', { taskId }, { token });
      const list = expectA2AResult(binding, listed);
      expect(list.configs.map((entry: { id: string }) => entry.id)).toEqual(['second', 'secret-hook']);
      expect(list.configs[0]).toMatchObject({ token: `…${otherToken.slice(-4)}`, authentication: { scheme: 'Bearer', credentials: `…${otherCredentials.slice(-4)}` } });
      for (const response of [got, listed]) for (const value of SECRETS) expect(response.text).not.toContain(value);
    }
    // The create answer is masked too.
    const created = await createPushConfigRpc(keel.url, token, 'echo', taskId, { id: 'third', url: receiver.url, authentication: { scheme: 'Bearer', credentials: otherCredentials } });
    expect(JSON.stringify(created)).not.toContain(otherCredentials);
  });

  it('no log line holds a credential or a token; the database holds them only sealed', async () => {
    const logs = captured.text();
    expect(logs.length).toBeGreaterThan(0);
    // The pause was logged (so the logs did see this config), without its secrets.
    expect(logs).toContain('config paused');
    for (const value of SECRETS) expect(logs).not.toContain(value);
    for (const value of SECRETS) {
      const found = await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT count(*)::int AS n FROM push_configs
        WHERE position(convert_to(${value}, 'UTF8') IN coalesce(token, ''::bytea) || coalesce(credentials, ''::bytea)) > 0
          OR url LIKE ${`%${value}%`} OR coalesce(token_hint, '') LIKE ${`%${value}%`} OR coalesce(credentials_hint, '') LIKE ${`%${value}%`}`);
      expect(found).toBe(0);
      const elsewhere = await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT (SELECT count(*) FROM push_deliveries WHERE coalesce(last_outcome, '') LIKE ${`%${value}%`})::int
          + (SELECT count(*) FROM push_attempts WHERE outcome LIKE ${`%${value}%`} OR coalesce(error_class, '') LIKE ${`%${value}%`})::int AS n`);
      expect(elsewhere).toBe(0);
    }
  });
});
