import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor } from '../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  answerAfterTerminalEvent,
  configState,
  createPushConfigRpc,
  deliveriesOf,
  newClientToken,
  sendWithPush,
  startReceiver,
  waitForSettled,
  type Receiver,
} from '../integration/push/push-support.js';

// The operator's push commands against a running Keel: `keel push list [--state]` shows configs
// with their delivery counts and masked credentials, `keel push show` one config's deliveries and
// every attempt, `keel push resume` sends a paused config's waiting deliveries, in order.

const CREDENTIAL = 'cli-secret-credential-WXYZ';
const TOKEN = 'cli-secret-token-QRST';

let keel: TestKeel;
let env: NodeJS.ProcessEnv;
let clientToken = '';
const receivers: Receiver[] = [];
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });

let pausedTask = '';
let stoppedTask = '';
let activeTask = '';
let answer401 = 401;

beforeAll(async () => {
  // A push timeout far above the receivers' hold (below), so a held answer is never a timeout.
  keel = await startTestKeel({ overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_TIMEOUT_SECONDS: '15' } });
  env = cleanEnv(cliEnvFor(keel));
  clientToken = await newClientToken(keel.context.pool);
  // The 401 and the 410 come once the task has ended: its three events each have a delivery then.
  const auth = await startReceiver(answerAfterTerminalEvent(keel.context.pool, () => ({ status: answer401 }), 10_000));
  const gone = await startReceiver(answerAfterTerminalEvent(keel.context.pool, () => ({ status: 410 }), 10_000));
  const fine = await startReceiver(() => ({ status: 200 }));
  receivers.push(auth, gone, fine);

  pausedTask = (await sendWithPush(keel.url, clientToken, 'echo', 'paused', { id: 'cli-paused', url: auth.url, token: TOKEN, authentication: { scheme: 'Bearer', credentials: CREDENTIAL } })).taskId;
  stoppedTask = (await sendWithPush(keel.url, clientToken, 'echo', 'stopped', { id: 'cli-stopped', url: gone.url })).taskId;
  activeTask = (await sendWithPush(keel.url, clientToken, 'echo', 'active', { id: 'cli-active', url: fine.url })).taskId;
  await waitFor(async () => (await configState(keel.context.pool, pausedTask, 'cli-paused'))?.state === 'paused', 'the paused config');
  await waitForSettled(keel.context.pool, stoppedTask);
  await waitForSettled(keel.context.pool, activeTask);
});
afterAll(async () => {
  for (const receiver of receivers) await receiver.close();
  await keel?.dispose();
});

const noSecrets = (output: string) => {
  expect(output).not.toContain(CREDENTIAL);
  expect(output).not.toContain(TOKEN);
};

describe('keel push list', () => {
  it('lists every config with its state, counts and masked credentials', async () => {
    const listed = await keelCli('push', 'list');
    expect(listed.stderr).toBe('');
    expect(listed.code).toBe(0);
    const lines = listed.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^CONFIG\s+STATE\s+REASON\s+URL\s+AUTH\s+PENDING\s+DELIVERED\s+FAILED$/);
    const line = (id: string) => lines.find((candidate) => candidate.includes(`/${id} `))!;
    expect(line('cli-paused')).toMatch(new RegExp(`^${pausedTask}/cli-paused\\s+paused\\s+authentication failed\\s+http://127\\.0\\.0\\.1:\\d+/hook\\s+Bearer …WXYZ\\s+3\\s+0\\s+0$`));
    expect(line('cli-stopped')).toMatch(/\sstopped\s+receiver answered 410\s.*\s-\s+0\s+0\s+3$/);
    expect(line('cli-active')).toMatch(/\sactive\s+http:\S+\s+-\s+0\s+3\s+0$/);
    noSecrets(listed.stdout);
  });

  it('--state paused and --state stopped filter; --json prints one object a line; a bad state is a usage error', async () => {
    const paused = await keelCli('push', 'list', '--state', 'paused');
    expect(paused.code).toBe(0);
    const rows = paused.stdout.trim().split('\n').slice(1);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toContain(`${pausedTask}/cli-paused`);
    expect(rows[0]).toContain('authentication failed');
    noSecrets(paused.stdout);

    const stopped = await keelCli('push', 'list', '--state', 'stopped');
    expect(stopped.stdout.trim().split('\n').slice(1)).toEqual([expect.stringContaining(`${stoppedTask}/cli-stopped`)]);

    const json = await keelCli('push', 'list', '--state', 'paused', '--json');
    expect(json.code).toBe(0);
    const objects = json.stdout.trim().split('\n').map((text) => JSON.parse(text));
    expect(objects).toEqual([
      expect.objectContaining({ taskId: pausedTask, id: 'cli-paused', state: 'paused', reason: 'authentication failed', authentication: 'Bearer …WXYZ', pending: 3, delivered: 0, failed: 0 }),
    ]);
    noSecrets(json.stdout);

    const bad = await keelCli('push', 'list', '--state', 'sleeping');
    expect(bad.code).toBe(64);
    expect(bad.stderr).toContain('--state must be one of active, paused, stopped');
  });
});

describe('keel push show', () => {
  it('prints the config, its deliveries and every attempt, credentials masked', async () => {
    const shown = await keelCli('push', 'show', 'cli-paused');
    expect(shown.stderr).toBe('');
    expect(shown.code).toBe(0);
    expect(shown.stdout).toContain(`config    ${pausedTask}/cli-paused`);
    expect(shown.stdout).toMatch(/url\s+http:\/\/127\.0\.0\.1:\d+\/hook/);
    expect(shown.stdout).toContain('state     paused (authentication failed)');
    expect(shown.stdout).toContain('auth      Bearer …WXYZ');
    const deliveries = await deliveriesOf(keel.context.pool, pausedTask);
    for (const delivery of deliveries) expect(shown.stdout).toContain(`[${delivery.id}]`);
    expect(shown.stdout).toMatch(/#1\s+pending\s+1\s+waiting: receiver answered 401 \(authentication failed\)/);
    expect(shown.stdout).toMatch(/attempt 1\s+\d{4}-\d\d-\d\dT\S+\s+401\s+\d+ ms\s+paused/);
    noSecrets(shown.stdout);

    const stopped = await keelCli('push', 'show', `${stoppedTask}/cli-stopped`, '--json');
    expect(stopped.code).toBe(0);
    const detail = JSON.parse(stopped.stdout);
    expect(detail).toMatchObject({ task_id: stoppedTask, id: 'cli-stopped', state: 'stopped', state_reason: 'receiver answered 410' });
    expect(detail.deliveries.map((delivery: { state: string }) => delivery.state)).toEqual(['cancelled', 'cancelled', 'cancelled']);
    expect(detail.attempts).toEqual([expect.objectContaining({ attempt: 1, status_code: 410, outcome: 'stopped' })]);
  });

  it('an unknown config is not found; an id used by two tasks must be named taskId/configId', async () => {
    const missing = await keelCli('push', 'show', 'no-such-config');
    expect(missing.code).toBe(6);
    expect(missing.stderr).toContain('no push config no-such-config');

    await createPushConfigRpc(keel.url, clientToken, 'echo', activeTask, { id: 'cli-paused', url: receivers[2]!.url });
    const ambiguous = await keelCli('push', 'show', 'cli-paused');
    expect(ambiguous.code).toBe(64);
    expect(ambiguous.stderr).toContain('name it as <taskId>/<configId>');
    const named = await keelCli('push', 'show', `${pausedTask}/cli-paused`);
    expect(named.code).toBe(0);
    expect(named.stdout).toContain('state     paused (authentication failed)');
  });
});

describe('keel push resume', () => {
  it('resumes a paused config: its waiting deliveries go out in order; resuming again is refused', async () => {
    answer401 = 200;
    const resumed = await keelCli('push', 'resume', `${pausedTask}/cli-paused`);
    expect(resumed.stderr).toBe('');
    expect(resumed.code).toBe(0);
    expect(resumed.stdout).toContain(`push config ${pausedTask}/cli-paused resumed; 3 pending delivery(ies) go out in order`);
    const rows = await waitForSettled(keel.context.pool, pausedTask, 'cli-paused');
    expect(rows.map((row) => row.state)).toEqual(['delivered', 'delivered', 'delivered']);
    const receiver = receivers[0]!;
    expect(receiver.requests.map((request) => request.deliveryId)).toEqual([rows[0]!.id, ...rows.map((row) => row.id)]);

    const again = await keelCli('push', 'resume', `${pausedTask}/cli-paused`);
    expect(again.code).toBe(1);
    expect(again.stderr).toContain('is active, not paused');
    const stopped = await keelCli('push', 'resume', 'cli-stopped');
    expect(stopped.code).toBe(1);
    expect(stopped.stderr).toContain('is stopped, not paused');

    const listed = await keelCli('push', 'list', '--state', 'paused');
    expect(listed.stdout.trim().split('\n').slice(1)).toEqual([]);
  });
});
