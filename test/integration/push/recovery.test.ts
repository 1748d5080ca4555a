import { afterAll, describe, expect, it } from 'vitest';
import { cleanEnv, spawnKeel, type KeelProcess } from '../../support/keel-process.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';
import { startTestKeel, TEST_POOL_ENV, tempDir, type TestKeel } from '../../support/test-keel.js';
import { deleteQueueKeys, TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../../support/test-queues.js';
import { waitFor } from '../../support/wait-for.js';
import {
  PUSH_TEST_OVERRIDES,
  PUSH_TEST_TIMINGS,
  attemptsOf,
  deliveriesOf,
  journalOf,
  newClientToken,
  sendWithPush,
  startReceiver,
  waitForSettled,
  waitForTerminalEvent,
  type Receiver,
} from './push-support.js';

// The outbox survives losing its queue and its worker: deliveries are rows, jobs only wake-ups.
// - Redis wiped (this Keel's keys, not FLUSHALL: other test files share the server) while
//   deliveries wait for retries: the maintenance sweep gives every due delivery its job back.
// - A worker SIGKILLed in the middle of a POST: its attempt was counted and leased; when the lease
//   runs out another Keel retries it, with the same X-Keel-Delivery-Id.

const QUEUE = testQueueKind();
const keels: TestKeel[] = [];
const children: KeelProcess[] = [];
const databases: TestDatabase[] = [];
const receivers: Receiver[] = [];
const prefixes: string[] = [];

const deleteKeys = (prefix: string): Promise<number> => deleteQueueKeys([prefix]);

afterAll(async () => {
  for (const child of children) {
    if (child.child.exitCode === null && child.child.signalCode === null) {
      child.child.kill('SIGKILL');
      await child.exited;
    }
  }
  for (const keel of keels) await keel.dispose().catch(() => undefined);
  for (const receiver of receivers) await receiver.close();
  for (const database of databases) await database.drop().catch(() => undefined);
  if (QUEUE === 'redis') for (const prefix of prefixes) await deleteKeys(prefix);
});

describe('queue lost', () => {
  // Only Redis can be wiped apart from the database: on the Postgres backend the jobs live in
  // Keel's own database, and losing them means losing the outbox rows too.
  it.skipIf(QUEUE !== 'redis')("this Keel's Redis keys deleted while deliveries are pending: all are still delivered", async () => {
    const keel = await startTestKeel({
      pushTestTimings: PUSH_TEST_TIMINGS,
      overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_RETRY_BASE_SECONDS: '1', KEEL_PUSH_RETRY_MAX_SECONDS: '1' },
    });
    keels.push(keel);
    const token = await newClientToken(keel.context.pool);
    let blocked = true;
    const receiver = await startReceiver(() => ({ status: blocked ? 503 : 200 }));
    receivers.push(receiver);
    const tasks = await Promise.all([1, 2, 3, 4].map((n) => sendWithPush(keel.url, token, 'echo', `task ${n}`, { id: 'hook', url: receiver.url })));
    // Every config's first delivery has failed once and waits for its retry job.
    await waitFor(async () => {
      const perTask = await Promise.all(tasks.map(({ taskId }) => deliveriesOf(keel.context.pool, taskId)));
      return perTask.every((rows) => rows.length === 3 && rows[0]!.attempts >= 1 && rows[0]!.state === 'pending');
    }, 'every delivery to be written and every first delivery to have failed once');

    const deleted = await deleteKeys(keel.config.queue.prefix);
    expect(deleted).toBeGreaterThan(0);
    blocked = false;

    for (const { taskId } of tasks) {
      const rows = await waitForSettled(keel.context.pool, taskId, undefined, 45_000);
      expect(rows.map((row) => row.state)).toEqual(['delivered', 'delivered', 'delivered']);
      const journal = await journalOf(keel.context.pool, keel.context.sealer, taskId);
      expect(rows.map((row) => receiver.byDelivery(row.id).at(-1)!.body)).toEqual(journal.map((event) => event.response));
    }
  });
});

describe('worker killed', () => {
  it('a worker SIGKILLed mid-POST: the delivery is retried by another Keel and arrives with the same delivery id', async () => {
    const database = await createTestDatabase();
    databases.push(database);
    const prefix = testQueuePrefix();
    prefixes.push(prefix);
    const masterKey = Buffer.alloc(32, 11).toString('base64');
    const env: Record<string, string> = {
      KEEL_DATABASE_URL: database.url,
      KEEL_MASTER_KEY: masterKey,
      KEEL_SERVER_PORT: '0',
      KEEL_DATA_DIR: tempDir('keel-push-kill-'),
      KEEL_QUEUE_PREFIX: prefix,
      ...(QUEUE === 'redis' ? { KEEL_QUEUE_REDIS_URL: TEST_REDIS_URL } : {}),
      ...Object.fromEntries(Object.entries(PUSH_TEST_OVERRIDES).map(([key, value]) => [key, String(value)])),
    };
    const token = await newClientToken(database.pool);

    let killed = false;
    const receiver = await startReceiver((request) => (request.index === 0 ? 'hang' : { status: 200 }));
    receivers.push(receiver);
    const child = spawnKeel(['start'], {
      cwd: tempDir('keel-push-kill-cwd-'),
      env: cleanEnv({ ...TEST_POOL_ENV, ...env }),
      // A timeout long enough that the held request is still in flight when the worker is killed
      // (the test first waits for the task to end); the attempt's lease (2 × timeout + 1 s) then
      // decides when it is tried again. Handed over by the harness's entry, not the environment.
      harness: { pushTestTimings: { timeoutSeconds: 4 } },
    });
    children.push(child);
    const ready = await child.waitForLog('keel is ready', 60_000);
    const { taskId } = await sendWithPush(String(ready.url), token, 'echo', 'kill me', { id: 'hook', url: receiver.url });

    await waitFor(async () => receiver.requests.length === 1, 'the first POST to reach the receiver');
    // The fast path runs the task in this process and the first event's POST can arrive before the
    // run's completion commits; killed then, the run would wait out its lease (60 s), which is
    // the executor-crash tests' subject, not this one's. Here only the delivery dies mid-POST.
    await waitForTerminalEvent(database.pool, taskId, 3000);
    child.child.kill('SIGKILL');
    const exit = await child.exited;
    killed = exit.signal === 'SIGKILL';
    expect(killed).toBe(true);
    await waitFor(async () => receiver.requests[0]!.aborted, 'the killed request to be cut off', 5000);
    const first = receiver.requests[0]!.deliveryId;
    // The attempt was counted before the POST.
    expect((await deliveriesOf(database.pool, taskId)).find((row) => row.id === first)).toMatchObject({ state: 'pending', attempts: 1 });

    const replacement = await startTestKeel({
      pushTestTimings: PUSH_TEST_TIMINGS,
      databaseUrl: database.url,
      env: { KEEL_MASTER_KEY: masterKey, KEEL_QUEUE_PREFIX: prefix },
      overrides: { ...PUSH_TEST_OVERRIDES },
    });
    keels.push(replacement);
    const rows = await waitForSettled(replacement.context.pool, taskId, undefined, 45_000);
    expect(rows.map((row) => row.state)).toEqual(['delivered', 'delivered', 'delivered']);
    expect(rows[0]!.id).toBe(first);
    expect(rows[0]!.attempts).toBe(2);
    // At least once, with the same delivery id: the cut-off request and the retry.
    const ofFirst = receiver.byDelivery(first);
    expect(ofFirst.length).toBeGreaterThanOrEqual(2);
    expect(ofFirst[0]!.raw).toBe(ofFirst.at(-1)!.raw);
    // The killed attempt left no row (its process died before recording it); the retry did.
    expect((await attemptsOf(replacement.context.pool, first)).map((a) => [a.attempt, a.status_code, a.outcome])).toEqual([[2, 200, 'delivered']]);
    // And the order held: the later events came after the retried first one.
    const firstArrivals = [...new Set(receiver.requests.map((request) => request.deliveryId))];
    expect(firstArrivals).toEqual(rows.map((row) => row.id));
  });
});
