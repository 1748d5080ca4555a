import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { callA2A, expectA2AResult, type Binding } from '../../support/a2a-wire.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  attemptCount,
  attemptsOf,
  configState,
  deliveriesOf,
  newClientToken,
  sendWithPush,
  sleep,
  startReceiver,
  waitForTerminalEvent,
  type Receiver,
} from './push-support.js';

// Deleting a config: a request already sent may still arrive (it is not recalled), but no attempt
// starts after the deletion: not a retry of the request in flight, not the deliveries behind it.
// Deletion is idempotent.

let keel: TestKeel;
let token = '';
const receivers: Receiver[] = [];

beforeAll(async () => {
  // A long timeout, so that the request held by the receiver is in flight when the config goes.
  keel = await startTestKeel({ overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_TIMEOUT_SECONDS: '10' } });
  token = await newClientToken(keel.context.pool);
});
afterAll(async () => {
  for (const receiver of receivers) await receiver.close();
  await keel?.dispose();
});

describe('deletion race', () => {
  it.each([
    { binding: 'JSONRPC' as Binding, answer: 200, note: 'the request in flight arrives and is acknowledged' },
    { binding: 'HTTP+JSON' as Binding, answer: 503, note: 'the request in flight fails: it is not retried' },
  ])('$binding, in flight answered $answer: $note; nothing is attempted after the deletion', async ({ binding, answer }) => {
    let release: () => void = () => undefined;
    const released = new Promise<void>((resolve) => (release = resolve));
    const receiver = await startReceiver(async (request) => {
      if (request.index === 0) {
        await released;
        return { status: answer };
      }
      return { status: 200 };
    });
    receivers.push(receiver);
    const configId = `doomed-${answer}`;
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'soon deleted', { id: configId, url: receiver.url });
    await waitFor(async () => receiver.requests.length === 1, 'the first request to be in flight');
    await waitForTerminalEvent(keel.context.pool, taskId);

    const deleted = await callA2A(keel.url, 'echo', binding, 'DeleteTaskPushNotificationConfig', { taskId, id: configId }, { token });
    expectA2AResult(binding, deleted);
    expect(await configState(keel.context.pool, taskId, configId)).toMatchObject({ deleted: true });
    // Every delivery is cancelled at once, the one in flight included.
    expect((await deliveriesOf(keel.context.pool, taskId, configId)).map((row) => row.state)).toEqual(['cancelled', 'cancelled', 'cancelled']);

    // The request already sent finishes (the receiver has it; that is the documented race).
    release();
    const first = receiver.requests[0]!;
    await waitFor(async () => first.endedAt !== null, 'the request in flight to finish');
    const inFlight = (await deliveriesOf(keel.context.pool, taskId, configId))[0]!;
    await waitFor(async () => (await attemptsOf(keel.context.pool, inFlight.id)).length === 1, 'the in-flight attempt to be recorded');
    expect((await attemptsOf(keel.context.pool, inFlight.id)).map((a) => a.status_code)).toEqual([answer]);

    // Several sweeps and any retry delay later: no new attempt, no new request.
    await sleep(2500);
    expect(receiver.requests).toHaveLength(1);
    expect(await attemptCount(keel.context.pool, taskId, configId)).toBe(1);
    const rows = await deliveriesOf(keel.context.pool, taskId, configId);
    expect(rows.map((row) => [row.state, row.attempts])).toEqual([
      ['cancelled', 1],
      ['cancelled', 0],
      ['cancelled', 0],
    ]);

    // Idempotent: deleting again is fine; the config is gone from Get and List.
    expectA2AResult(binding, await callA2A(keel.url, 'echo', binding, 'DeleteTaskPushNotificationConfig', { taskId, id: configId }, { token }));
    expectA2AResult(binding, await callA2A(keel.url, 'echo', binding, 'DeleteTaskPushNotificationConfig', { taskId, id: 'never-existed' }, { token }));
    const got = await callA2A(keel.url, 'echo', binding, 'GetTaskPushNotificationConfig', { taskId, id: configId }, { token });
    expect(got.body?.error).toBeDefined();
    const listed = expectA2AResult(binding, await callA2A(keel.url, 'echo', binding, 'ListTaskPushNotificationConfigs', { taskId }, { token }));
    expect(listed.configs ?? []).toEqual([]);
  });

  it('a config deleted while its deliveries wait for a retry gets no further attempt', async () => {
    // Retries are due in 10–2000 ms; the deletion comes right after the first failure.
    const receiver = await startReceiver(() => ({ status: 503 }));
    receivers.push(receiver);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'retrying', { id: 'retrying', url: receiver.url });
    await waitFor(async () => receiver.requests.length >= 1, 'a first attempt');
    const deleted = await callA2A(keel.url, 'echo', 'JSONRPC', 'DeleteTaskPushNotificationConfig', { taskId, id: 'retrying' }, { token });
    expectA2AResult('JSONRPC', deleted);
    await sleep(100);
    const attempts = await attemptCount(keel.context.pool, taskId, 'retrying');
    const requests = receiver.requests.length;
    await sleep(2500);
    expect(await attemptCount(keel.context.pool, taskId, 'retrying')).toBe(attempts);
    expect(receiver.requests).toHaveLength(requests);
    await waitForTerminalEvent(keel.context.pool, taskId);
    expect((await deliveriesOf(keel.context.pool, taskId, 'retrying')).every((row) => row.state === 'cancelled')).toBe(true);
  });
});
