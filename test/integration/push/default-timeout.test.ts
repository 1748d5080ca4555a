import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { PUSH_TEST_OVERRIDES, attemptsOf, newClientToken, sendWithPush, startReceiver, waitForSettled, type Receiver } from './push-support.js';

// The default push timeout, 15 s, on a Keel that sets no timeout at all (no push.timeoutSeconds,
// no test-only knob): a receiver that never answers has its attempt cut at 15 s, recorded as a
// timeout, and the delivery is retried with the same delivery id.

const DEFAULT_TIMEOUT_MS = 15_000;

let keel: TestKeel;
let receiver: Receiver;

beforeAll(async () => {
  // No test timings: the configuration's default timeout.
  keel = await startTestKeel({ overrides: PUSH_TEST_OVERRIDES });
  // Only the very first request hangs (the first delivery's first attempt); everything else is answered.
  receiver = await startReceiver((request) => (request.index === 0 ? 'hang' : { status: 200 }));
});
afterAll(async () => {
  await receiver?.close();
  await keel?.dispose();
});

describe('push.timeoutSeconds by default', () => {
  it('is 15 s: a receiver that never answers is cut off at 15 s, the attempt recorded as a timeout and retried', async () => {
    expect(keel.config.push.timeoutSeconds).toBe(15);
    const token = await newClientToken(keel.context.pool);
    const { taskId } = await sendWithPush(keel.url, token, 'echo', 'slow receiver', { id: 'slow', url: receiver.url });
    const rows = await waitForSettled(keel.context.pool, taskId, 'slow', 60_000);
    expect(rows.every((row) => row.state === 'delivered')).toBe(true);

    const first = rows[0]!;
    const attempts = await attemptsOf(keel.context.pool, first.id);
    expect(attempts.map((attempt) => [attempt.attempt, attempt.status_code, attempt.error_class, attempt.outcome])).toEqual([
      [1, null, 'timeout', 'retry'],
      [2, 200, null, 'delivered'],
    ]);
    // Cut at the timeout, not before it.
    expect(attempts[0]!.duration_ms).toBeGreaterThanOrEqual(DEFAULT_TIMEOUT_MS - 50);
    expect(attempts[1]!.started_at).toBeGreaterThanOrEqual(attempts[0]!.started_at + attempts[0]!.duration_ms);

    // The receiver saw Keel close the hung request unanswered after 15 s, then the same delivery again.
    const requests = receiver.byDelivery(first.id);
    expect(requests).toHaveLength(2);
    await waitFor(async () => requests[0]!.aborted && requests[0]!.endedAt !== null, 'the hung request to be closed', 5000);
    // Keel's clock starts before the connection is made (the address guard resolves the name
    // first), so the receiver holds the request a little less than 15 s: 14.89 s once under load.
    expect(requests[0]!.endedAt! - requests[0]!.at).toBeGreaterThanOrEqual(DEFAULT_TIMEOUT_MS - 500);
    expect(requests[1]!.at).toBeGreaterThanOrEqual(requests[0]!.endedAt!);
  });
});
