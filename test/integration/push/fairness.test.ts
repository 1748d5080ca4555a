import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { PUSH_TEST_OVERRIDES, newClientToken, sendWithPush, startReceiver, waitForSettled, type Receiver, type Reply } from './push-support.js';

// The client share of the push slots (docs/push.md, "Isolation"; issue 40): a client with a large
// backlog to slow but healthy receivers holds at most 14 of the 16 slots while it is alone (2 are
// kept in reserve), so another client's first delivery goes out while every one of the backlog's
// requests is still held: it waits for none of them to end. The receivers of the backlog hold each
// request until the test lets them answer (200); the push timeout is 60 s, far above the wait.

let keel: TestKeel;
let tokenA = '';
let tokenB = '';
const receivers: Receiver[] = [];
const held: Array<() => void> = [];
let holding = true;

beforeAll(async () => {
  keel = await startTestKeel({ pushTestTimings: { timeoutSeconds: 60 }, overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_CONCURRENCY: '16' } });
  tokenA = await newClientToken(keel.context.pool, 'fair-a');
  tokenB = await newClientToken(keel.context.pool, 'fair-b');
});
afterAll(async () => {
  holding = false;
  for (const release of held.splice(0)) release();
  for (const receiver of receivers) await receiver.close();
  await keel?.dispose();
});

/** Answers 200 once the test stops holding (slow but healthy: it always answers, in time). */
const heldAnswer = (): Reply | Promise<Reply> =>
  holding ? new Promise<Reply>((resolve) => held.push(() => resolve({ status: 200 }))) : { status: 200 };

describe('push slots shared between clients', () => {
  it("sends a client's first delivery while another client's backlog holds every slot it may", async () => {
    const slow = await Promise.all(Array.from({ length: 8 }, () => startReceiver(heldAnswer)));
    const quick = await startReceiver();
    receivers.push(...slow, quick);
    const inFlightB = () => slow.reduce((sum, one) => sum + one.inFlight(), 0);

    const backlog: string[] = [];
    // 24 tasks, so 24 head deliveries ready at once: more than B may hold.
    for (let index = 0; index < 24; index += 1) {
      const { taskId } = await sendWithPush(keel.url, tokenB, 'echo', `backlog ${index}`, { id: 'hook', url: slow[index % slow.length]!.url });
      backlog.push(taskId);
    }
    // B alone: 14 of the 16 slots (8 destinations could take 32), 2 kept in reserve.
    await waitFor(async () => inFlightB() === 14 || null, "B's backlog holding 14 slots", 30_000);

    const { taskId } = await sendWithPush(keel.url, tokenA, 'echo', 'light', { id: 'hook', url: quick.url });
    await waitFor(async () => quick.requests.length > 0 || null, "A's first delivery", 20_000);
    // Not one of B's requests has ended: A's head did not wait for B to free a slot.
    expect(slow.flatMap((one) => one.requests).every((request) => request.endedAt === null)).toBe(true);
    expect(inFlightB()).toBe(14);
    // Before the reserve, B alone held all 16 slots and A's first delivery waited for one of them.

    holding = false;
    for (const release of held.splice(0)) release();
    expect((await waitForSettled(keel.context.pool, taskId, undefined, 30_000)).every((row) => row.state === 'delivered')).toBe(true);
    for (const id of backlog) expect((await waitForSettled(keel.context.pool, id, undefined, 120_000)).every((row) => row.state === 'delivered')).toBe(true);
  }, 240_000);
});
