import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminSession } from '../../support/operator-ui.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';
import { PUSH_TEST_OVERRIDES, attemptsOf, deliveriesOf, newClientToken, sendWithPush, sleep, startReceiver, waitForSettled, type Received, type Receiver } from './push-support.js';

// Push isolation (docs/push.md, "Isolation"; issue 40): one client's slow or hung receivers do not
// delay another client's deliveries. Real receivers on loopback; the push timeout is 3 s (the test
// harness's timings), the breaker opens after 3 failures and probes after 1 s. Each test failed on
// the code before the isolation: A's deliveries came after B's hung ones had held all 16 slots for
// a timeout; the 200 with a large body was `too_large` and retried; A's head delivery waited behind
// B's backlog of slow deliveries. Its bounds are latencies under a load of its own, so the suite
// runs it last and with the machine to itself (test/support/fault-files.ts, decision 0103).

/** How long client B's slow receivers take to answer: below the push timeout (3 s here), so they succeed. */
const SLOW_ANSWER_MS = 2_500;

let keel: TestKeel;
let tokenA = '';
let tokenB = '';
const receivers: Receiver[] = [];

beforeAll(async () => {
  keel = await startTestKeel({
    pushTestTimings: { timeoutSeconds: 3 },
    overrides: { ...PUSH_TEST_OVERRIDES, KEEL_PUSH_CONCURRENCY: '16', KEEL_PUSH_BREAKER_FAILURES: '3', KEEL_PUSH_BREAKER_COOLDOWN_SECONDS: '1' },
  });
  tokenA = await newClientToken(keel.context.pool, 'client-a');
  tokenB = await newClientToken(keel.context.pool, 'client-b');
});
afterAll(async () => {
  for (const receiver of receivers) await receiver.close();
  await keel?.dispose();
});

const pool = () => keel.context.pool;

async function receiver(...args: Parameters<typeof startReceiver>): Promise<Receiver> {
  const started = await startReceiver(...args);
  receivers.push(started);
  return started;
}

/** The value of one /metrics series (labels as written), or null when absent. */
async function metric(name: string, labels: string): Promise<number | null> {
  const text = await (await fetch(`${keel.url}/metrics`)).text();
  const line = text.split('\n').find((candidate) => candidate.startsWith(`${name}{${labels}}`));
  return line === undefined ? null : Number(line.split(' ').at(-1));
}

async function sendMany(token: string, count: number, url: (index: number) => string, label: string): Promise<string[]> {
  const ids: string[] = [];
  for (let index = 0; index < count; index += 1) {
    const { taskId } = await sendWithPush(keel.url, token, 'echo', `${label} ${index}`, { id: 'hook', url: url(index) });
    ids.push(taskId);
  }
  return ids;
}

const countedAttempts = async (taskIds: readonly string[]) =>
  pool().oneFirst(sql.type(z.object({ n: z.number() }))`
    SELECT count(*)::int AS n FROM push_attempts a JOIN push_deliveries d ON d.id = a.delivery_id WHERE d.task_id = ANY(${sql.array([...taskIds], 'uuid')})`);

describe('push isolation', () => {
  it('counts a 200 with a large body as delivered, once', async () => {
    const big = await receiver(() => ({ status: 200, body: 'x'.repeat(5 * 1024 * 1024) }));
    const [taskId] = await sendMany(tokenA, 1, () => big.url, 'large answer');
    const rows = await waitForSettled(pool(), taskId!, undefined, 20_000);
    expect(rows.map((row) => row.state)).toEqual(['delivered', 'delivered', 'delivered']);
    for (const row of rows) {
      expect(big.byDelivery(row.id)).toHaveLength(1);
      expect((await attemptsOf(pool(), row.id)).map((attempt) => attempt.outcome)).toEqual(['delivered']);
    }
  }, 30_000);

  it("does not keep a client's head deliveries behind another client's backlog", async () => {
    // B: 48 tasks over 8 receivers that each take 2.5 s to answer (within the 3 s timeout: no breaker).
    const slow = await Promise.all(Array.from({ length: 8 }, () => receiver(() => ({ status: 200, delayMs: SLOW_ANSWER_MS }))));
    const quick = await receiver();
    const backlog = await sendMany(tokenB, 48, (index) => slow[index % slow.length]!.url, 'backlog');
    await waitFor(async () => slow.some((one) => one.inFlight() > 0) || null, 'B deliveries in flight', 10_000);
    const sentAt = Date.now();
    const [taskId] = await sendMany(tokenA, 1, () => quick.url, 'light');
    const rows = await waitForSettled(pool(), taskId!, undefined, 20_000);
    expect(rows.every((row) => row.state === 'delivered')).toBe(true);
    const last = Math.max(...quick.requests.map((request) => request.at));
    // Behind the backlog, A would wait for 48 heads of 2.5 s on 16 slots: 7.5 s and more. A's three
    // deliveries go one after another (journal order per config); 5 s leaves room for a loaded CI
    // machine and still tells the two apart. (With heads of 1.5 s and a bound of 3 s, a CI run
    // beside two other files took 3.8 s, and one beside one other file 2.75 s.)
    expect(last - sentAt).toBeLessThan(2 * SLOW_ANSWER_MS);
    for (const one of slow) one.setResponder(() => ({ status: 200 }));
    for (const id of backlog) await waitForSettled(pool(), id, undefined, 60_000);
  }, 120_000);

  it("delivers a healthy client's events within 2 s while another's receiver hangs, and breaks the hung one's circuit", async () => {
    const hung = await receiver(() => 'hang');
    const healthy = await receiver();
    const destination = `destination="127.0.0.1:${hung.port}"`;
    const hungTasks = await sendMany(tokenB, 48, () => hung.url, 'hung');
    await waitFor(async () => hung.inFlight() > 0 || null, 'hung deliveries in flight', 10_000);

    // A's five tasks, each sent when the one before was accepted; a task's deliveries are timed
    // from its own send, so the bound is about push, not about how fast this client sends.
    const sentAt = new Map<string, number>();
    for (let index = 0; index < 5; index += 1) {
      const before = Date.now();
      const [id] = await sendMany(tokenA, 1, () => healthy.url, `healthy ${index}`);
      sentAt.set(id!, before);
    }
    const healthyTasks = [...sentAt.keys()];
    for (const id of healthyTasks) expect((await waitForSettled(pool(), id, undefined, 20_000)).every((row) => row.state === 'delivered')).toBe(true);
    expect(healthy.requests).toHaveLength(15);
    const taskOf = (request: Received): string => request.body?.statusUpdate?.taskId ?? request.body?.artifactUpdate?.taskId ?? request.body?.task?.id;
    const latencies = healthyTasks.map((id) => Math.max(...healthy.requests.filter((request) => taskOf(request) === id).map((request) => request.at)) - sentAt.get(id)!);
    // Push's own delay: from the commit that queued a delivery (its outbox row's created_at) to
    // its arrival here. Timed from the send, the bound would also hold the agent's run and the
    // commits, which a loaded CI machine stretches (2.6 s once beside another file) and which
    // isolation is not about. Before: 43 s and more in the issue; here after the 3 s timeout of
    // 16 hung slots.
    const queuedAt = new Map(
      (
        await pool().any(sql.type(z.object({ id: z.string(), queued_ms: z.number() }))`
          SELECT id, (extract(epoch FROM created_at) * 1000)::float8 AS queued_ms FROM push_deliveries WHERE task_id = ANY(${sql.array(healthyTasks, 'uuid')})`)
      ).map((row) => [row.id, row.queued_ms]),
    );
    const pushDelays = healthy.requests.map((request) => Math.round(request.at - queuedAt.get(request.deliveryId)!));
    console.log(`push isolation: healthy deliveries ${pushDelays.join(', ')} ms after they were queued; each task's last ${latencies.join(', ')} ms after its send`);
    expect(pushDelays.every(Number.isFinite), 'every healthy request names a delivery of its task').toBe(true);
    expect(Math.max(...pushDelays), `each healthy delivery after it was queued (ms): ${pushDelays.join(', ')}`).toBeLessThan(2_000);
    // A destination holds at most a quarter of the 16 slots.
    expect(hung.maxInFlight()).toBeLessThanOrEqual(4);

    // Three timeouts open the breaker; the metrics and the push page say so.
    await waitFor(async () => ((await metric('keel_push_destination_breaker', `${destination},state="open"`)) === 1) || null, 'the breaker open', 15_000);
    expect(await metric('keel_push_destination_backlog', destination)).toBeGreaterThan(0);
    const session = await adminSession(keel);
    const page = await (await fetch(`${keel.url}/ui/push`, { headers: { cookie: session.cookie } })).text();
    expect(page).toContain(`data-destination="127.0.0.1:${hung.port}"`);
    expect(page).toMatch(/<td class="mono">127\.0\.0\.1:\d+<\/td><td><span[^>]*>(open|half_open)</);

    // While open, nothing but one probe at a time is in flight there: the deferred ones hold no slot.
    await sleep(3_500);
    let most = 0;
    for (let sample = 0; sample < 60; sample += 1) {
      most = Math.max(most, hung.inFlight());
      await sleep(50);
    }
    expect(most).toBeLessThanOrEqual(1);

    // The receiver recovers: a probe succeeds, the breaker closes, every delivery goes.
    hung.setResponder(() => ({ status: 200 }));
    for (const id of hungTasks) expect((await waitForSettled(pool(), id, undefined, 60_000)).every((row) => row.state === 'delivered')).toBe(true);
    expect(await metric('keel_push_destination_breaker', `${destination},state="closed"`)).toBe(1);
    // A deferral is not an attempt: every counted attempt is a request the receiver got.
    expect(await countedAttempts(hungTasks)).toBe(hung.requests.length);
    expect((await Promise.all(hungTasks.map((id) => deliveriesOf(pool(), id)))).flat()).toHaveLength(144);
  }, 180_000);
});
