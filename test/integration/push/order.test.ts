import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  createPushConfigRpc,
  deliveriesOf,
  journalOf,
  newClientToken,
  sendWithPush,
  startReceiver,
  waitForSettled,
  type Receiver,
  type Received,
} from './push-support.js';

// Per config, events reach the receiver in journal order: a delivery starts only after every
// earlier delivery of its config has ended, also when the earlier one needs retries. A scripted
// agent emits several artifacts quickly; the receiver is slow and fails some requests.

const ARTIFACTS = 6;
const overrides = {
  ...PUSH_TEST_OVERRIDES,
  KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
  KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
  KEEL_PROVIDERS: {
    steps: {
      type: 'scripted',
      steps: [
        ...Array.from({ length: ARTIFACTS }, (_, index) => ({
          artifact: { artifactId: `part-${index + 1}`, name: `part ${index + 1}`, text: `chunk ${index + 1}` },
          toolCalls: [{ name: 'lookup', arguments: { key: String(index) } }],
          delayMs: 25,
        })),
        { reply: 'all parts emitted', delayMs: 25 },
      ],
    },
  },
  KEEL_AGENTS: [{ id: 'steps', name: 'Steps', provider: 'steps', tools: ['lookup'], limits: { maxIterations: 20 } }],
};

let keel: TestKeel;
let token = '';
let receiver: Receiver;

beforeAll(async () => {
  keel = await startTestKeel({ pushTestTimings: PUSH_TEST_TIMINGS, overrides });
  token = await newClientToken(keel.context.pool);
});
afterAll(async () => {
  await receiver?.close();
  await keel?.dispose();
});

/** The receiver's requests of one config's deliveries never overlap, and follow journal order. */
function expectSequential(requests: readonly Received[], sequenceOf: Map<string, number>) {
  for (let i = 1; i < requests.length; i += 1) {
    const previous = requests[i - 1]!;
    expect(previous.endedAt, 'the previous request had ended').not.toBeNull();
    expect(requests[i]!.at).toBeGreaterThanOrEqual(previous.endedAt!);
    expect(sequenceOf.get(requests[i]!.deliveryId)!).toBeGreaterThanOrEqual(sequenceOf.get(previous.deliveryId)!);
  }
}

describe('order per config', () => {
  it('events of one task reach a slow receiver in journal order, also across retries', async () => {
    // Slow (80 ms per answer), and every third request fails with 503 (retried after 10–2000 ms).
    let count = 0;
    receiver = await startReceiver(() => {
      count += 1;
      return count % 3 === 0 ? { status: 503, delayMs: 80 } : { status: 200, delayMs: 80 };
    });
    // Three tasks at once, one config each, plus a second config on the first task: configs run
    // side by side, each in its own order.
    const tasks = await Promise.all([1, 2, 3].map((n) => sendWithPush(keel.url, token, 'steps', `task ${n}`, { id: 'primary', url: receiver.url })));
    const first = tasks[0]!.taskId;
    await createPushConfigRpc(keel.url, token, 'steps', first, { id: 'secondary', url: receiver.url });

    for (const { taskId } of tasks) {
      const rows = await waitForSettled(keel.context.pool, taskId, 'primary', 60_000);
      const journal = await journalOf(keel.context.pool, keel.context.sealer, taskId);
      // WORKING, six artifacts, the final answer's artifact and COMPLETED: all delivered.
      expect(journal.filter((event) => event.kind === 'artifact').length).toBeGreaterThanOrEqual(ARTIFACTS);
      expect(rows.map((row) => row.event_sequence)).toEqual(journal.map((event) => event.sequence));
      expect(rows.every((row) => row.state === 'delivered')).toBe(true);

      const sequenceOf = new Map(rows.map((row) => [row.id, row.event_sequence]));
      const requests = receiver.requests.filter((request) => sequenceOf.has(request.deliveryId));
      expectSequential(requests, sequenceOf);
      // Acknowledged bodies, in order, are the journal.
      expect(rows.map((row) => receiver.byDelivery(row.id).at(-1)!.body)).toEqual(journal.map((event) => event.response));
      for (const row of rows) expect(receiver.byDelivery(row.id)).toHaveLength(row.attempts);
    }
    // Retries happened (every third request), and still nothing overtook.
    const all = await Promise.all(tasks.map(({ taskId }) => deliveriesOf(keel.context.pool, taskId, 'primary')));
    expect(all.flat().some((row) => row.attempts > 1)).toBe(true);

    // The second config of the first task saw the events written after its creation, in order too.
    const secondary = await waitFor(async () => {
      const rows = await deliveriesOf(keel.context.pool, first, 'secondary');
      return rows.every((row) => row.state !== 'pending') ? rows : null;
    }, 'the second config to settle');
    if (secondary.length > 0) {
      const sequenceOf = new Map(secondary.map((row) => [row.id, row.event_sequence]));
      expectSequential(receiver.requests.filter((request) => sequenceOf.has(request.deliveryId)), sequenceOf);
      expect(secondary.every((row) => row.state === 'delivered')).toBe(true);
    }
    // Configs are independent: requests of different configs did overlap.
    expect(receiver.maxInFlight()).toBeGreaterThan(1);
  });
});
