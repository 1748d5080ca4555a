import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkUrl } from '../../../src/net/guarded-fetch.js';
import { BAD_REQUEST_TYPE, callA2A, expectA2AError, rowCounts, type Binding } from '../../support/a2a-wire.js';
import { createEmptyDatabase } from '../../support/test-database.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  attemptsOf,
  configState,
  createPushConfigRpc,
  deliveriesOf,
  newClientToken,
  rpc,
  sendWithPush,
  startReceiver,
  waitForSettled,
  waitForTerminalEvent,
  type Receiver,
} from './push-support.js';

// The address guard on push targets: refused when the config is created (-32602 with a BadRequest
// field violation naming the reason; nothing stored), and again before every attempt (refused:
// the config is stopped, its deliveries cancelled). Redirects are never followed. No test here
// connects anywhere but 127.0.0.1: every other target is refused before a connection is made.

/** Targets the guard refuses for a Keel whose allowHosts does not list them, with the reason. */
const refusedTargets = (loopbackPort: number) => [
  { name: '127.0.0.1 (not in allowHosts)', url: `http://127.0.0.1:${loopbackPort}/hook`, reason: 'refused_range' },
  { name: '10.0.0.1', url: 'http://10.0.0.1/hook', reason: 'refused_range' },
  { name: '169.254.169.254', url: 'http://169.254.169.254/latest/meta-data/', reason: 'refused_range' },
  { name: '[::1]', url: `http://[::1]:${loopbackPort}/hook`, reason: 'refused_range' },
  { name: '[::ffff:127.0.0.1]', url: `http://[::ffff:127.0.0.1]:${loopbackPort}/hook`, reason: 'refused_range' },
  { name: '[::ffff:7f00:1]', url: `http://[::ffff:7f00:1]:${loopbackPort}/hook`, reason: 'refused_range' },
  { name: '2130706433', url: `http://2130706433:${loopbackPort}/hook`, reason: 'numeric_host' },
  { name: '0x7f.0.0.1', url: `http://0x7f.0.0.1:${loopbackPort}/hook`, reason: 'numeric_host' },
  // A host name resolving to a private address (loopback), not listed in allowHosts.
  { name: 'localhost', url: `http://localhost:${loopbackPort}/hook`, reason: 'refused_range' },
];

const receivers: Receiver[] = [];
afterAll(async () => {
  for (const receiver of receivers) await receiver.close();
});

function expectRefusal(binding: Binding, response: Parameters<typeof expectA2AError>[1], field: string, reason: string) {
  const error = expectA2AError(binding, response, { code: -32602, reason: 'INVALID_ARGUMENT', httpStatus: 400, status: 'INVALID_ARGUMENT' });
  const details = (binding === 'JSONRPC' ? error.data : error.details) as Array<Record<string, unknown>>;
  const badRequest = details.find((detail) => detail['@type'] === BAD_REQUEST_TYPE) as { fieldViolations: Array<{ field: string; description: string }> } | undefined;
  expect(badRequest, JSON.stringify(details)).toBeDefined();
  expect(badRequest!.fieldViolations).toHaveLength(1);
  expect(badRequest!.fieldViolations[0]!.field).toBe(field);
  expect(badRequest!.fieldViolations[0]!.description).toContain(reason);
}

describe('at creation', () => {
  // A Keel that lists nothing in allowHosts (plain http allowed, so the scheme is not the reason).
  let strict: TestKeel;
  let strictToken = '';

  beforeAll(async () => {
    strict = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES, KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '' } });
    strictToken = await newClientToken(strict.context.pool);
  });
  afterAll(async () => strict?.dispose());

  it.each(refusedTargets(9))('CreateTaskPushNotificationConfig refuses $name ($reason) on both bindings; nothing is stored', async ({ url, reason }) => {
    const { taskId } = await sendWithPush(strict.url, strictToken, 'echo', 'guarded');
    const before = await rowCounts(strict.context.pool);
    for (const binding of ['JSONRPC', 'HTTP+JSON'] as const) {
      const response = await callA2A(strict.url, 'echo', binding, 'CreateTaskPushNotificationConfig', { taskId, id: `c-${binding}`, url }, { token: strictToken });
      expectRefusal(binding, response, 'config.url', reason);
    }
    expect(await rowCounts(strict.context.pool)).toEqual(before);
  });

  it.each(refusedTargets(9))('SendMessage with an embedded config refuses $name ($reason): no task, no config', async ({ url, reason }) => {
    const before = await rowCounts(strict.context.pool);
    const response = await rpc(strict.url, strictToken, 'echo', 'SendMessage', {
      message: { messageId: `guard-${Math.random()}`, role: 'ROLE_USER', parts: [{ text: 'hello' }] },
      configuration: { returnImmediately: true, taskPushNotificationConfig: { id: 'embedded', url } },
    });
    expectRefusal('JSONRPC', response, 'configuration.taskPushNotificationConfig.url', reason);
    expect(await rowCounts(strict.context.pool)).toEqual(before);
  });

});

describe('at delivery', () => {
  let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
  let creator: TestKeel | undefined;
  let deliverer: TestKeel | undefined;
  const masterKey = Buffer.alloc(32, 7).toString('base64');

  beforeAll(async () => {
    database = await createEmptyDatabase();
  });
  afterAll(async () => {
    await creator?.dispose();
    await deliverer?.dispose();
    await database?.drop();
  });

  it('a config valid at creation is refused at delivery when the guard no longer accepts its target: config stopped, nothing sent', async () => {
    const receiver = await startReceiver();
    receivers.push(receiver);
    const targets = refusedTargets(receiver.port);
    // Keel A: accepts these hosts (allowHosts) but runs no workers (role api), so nothing is
    // attempted while they are allowed.
    const prefix = `ktguard${Math.random().toString(16).slice(2, 10)}`;
    const env = { KEEL_MASTER_KEY: masterKey, KEEL_QUEUE_PREFIX: prefix };
    creator = await startTestKeel({
      pushTestTimings: PUSH_TEST_TIMINGS,
      databaseUrl: database.url,
      env,
      overrides: { ...PUSH_TEST_OVERRIDES, KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1,10.0.0.1,169.254.169.254,::1,::ffff:127.0.0.1,localhost' },
      start: { role: 'api' },
    });
    const token = await newClientToken(creator.context.pool);
    const { taskId } = await sendWithPush(creator.url, token, 'echo', 'deliver later');
    const configIds: string[] = [];
    for (const [index, target] of targets.entries()) {
      const id = `target-${index}`;
      configIds.push(id);
      if (target.reason === 'numeric_host') {
        // Numeric host forms are refused even when listed, so no API call can create one: the row
        // is written as an older installation might have stored it.
        await creator.context.pool.query(sql.unsafe`
          INSERT INTO push_configs (task_id, id, owner, url) SELECT ${taskId}, ${id}, owner, ${target.url} FROM a2a_tasks WHERE id = ${taskId}`);
      } else {
        await createPushConfigRpc(creator.url, token, 'echo', taskId, { id, url: target.url });
      }
    }
    expect(await waitForTerminalEvent(creator.context.pool, taskId, 300).then(() => true, () => false)).toBe(false);
    await creator.dispose();
    creator = undefined;

    // Keel B: the same installation without allowHosts. Before it starts, make sure its guard
    // refuses every target, so that no test ever connects to anything but loopback.
    const policy = { allowHosts: [], allowHttp: true };
    for (const target of targets) {
      const check = await checkUrl(target.url, policy);
      expect(check.ok, `${target.name} must be refused before any connection`).toBe(false);
      if (!check.ok) expect(check.refusal.reason).toBe(target.reason);
    }
    deliverer = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, databaseUrl: database.url, env, overrides: { ...PUSH_TEST_OVERRIDES, KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '' } });
    const pool = deliverer.context.pool;
    await waitForSettled(pool, taskId);
    for (const [index, target] of targets.entries()) {
      const configId = configIds[index]!;
      const state = await waitFor(async () => {
        const current = await configState(pool, taskId, configId);
        return current?.state === 'stopped' ? current : null;
      }, `config ${configId} (${target.name}) to stop`);
      expect(state.state_reason, target.name).toMatch(new RegExp(`^address guard: .*refused`));
      const rows = await deliveriesOf(pool, taskId, configId);
      // At least the SUBMITTED event's delivery; the later events get one only if they were projected
      // before the first attempt stopped the config (a stopped config gets no new deliveries).
      expect(rows.length).toBeGreaterThanOrEqual(1);
      expect(rows.every((row) => row.state === 'cancelled'), target.name).toBe(true);
      // The one attempt that met the refusal is recorded; nothing else was tried.
      const attempts = (await Promise.all(rows.map((row) => attemptsOf(pool, row.id)))).flat();
      expect(attempts.map((a) => [a.status_code, a.outcome, a.error_class]), target.name).toEqual([[null, 'stopped', `refused:${target.reason}`]]);
    }
    expect(receiver.requests).toHaveLength(0);
    const stopped = await pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM push_configs WHERE task_id = ${taskId} AND state = 'stopped'`);
    expect(stopped).toBe(targets.length);
  });
});

describe('allowHosts and redirects', () => {
  let keel: TestKeel;
  beforeAll(async () => {
    keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides: { ...PUSH_TEST_OVERRIDES } });
  });
  afterAll(async () => keel?.dispose());

  it('allowHosts 127.0.0.1 lifts that literal only: the other loopback spellings stay refused', async () => {
    const receiver = await startReceiver();
    receivers.push(receiver);
    const token = await newClientToken(keel.context.pool);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'guarded');
    const before = await rowCounts(keel.context.pool);
    for (const target of refusedTargets(receiver.port).slice(1)) {
      const response = await rpc(keel.url, token, 'echo', 'CreateTaskPushNotificationConfig', { taskId, id: 'x', url: target.url });
      expectRefusal('JSONRPC', response, 'config.url', target.reason);
    }
    expect(await rowCounts(keel.context.pool)).toEqual(before);
    // The listed literal itself is accepted.
    await createPushConfigRpc(keel.url, token, 'echo', taskId, { id: 'ok', url: receiver.url });
  });

  it('a redirect to 169.254.169.254 is not followed: recorded as a 302 and retried at the configured URL', async () => {
    let first = true;
    const receiver = await startReceiver(() => {
      if (!first) return { status: 200 };
      first = false;
      return { status: 302, headers: { location: 'http://169.254.169.254/latest/meta-data/iam/security-credentials/' } };
    });
    receivers.push(receiver);
    const token = await newClientToken(keel.context.pool);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'redirected', { id: 'hook', url: receiver.url });
    const rows = await waitForSettled(keel.context.pool, taskId);
    expect(rows.every((row) => row.state === 'delivered')).toBe(true);
    const attempts = await attemptsOf(keel.context.pool, rows[0]!.id);
    expect(attempts.map((a) => [a.status_code, a.outcome, a.error_class])).toEqual([
      [302, 'retry', null],
      [200, 'delivered', null],
    ]);
    // Both attempts came to the configured URL.
    expect(receiver.byDelivery(rows[0]!.id).map((request) => request.path)).toEqual(['/hook', '/hook']);
  });
});
