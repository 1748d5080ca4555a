import { randomUUID } from 'node:crypto';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { silentLogger } from '../../src/log/logger.js';
import { DELAY_BUCKETS } from '../../src/metrics/keel-metrics.js';
import { QUEUE_NAMES } from '../../src/queue/queue-names.js';
import { cancelRun } from '../../src/runs/run-repository.js';
import { LOOPBACK_PUSH_OVERRIDES, sendWithPush, startHookReceiver, type HookReceiver } from '../support/operator-ui.js';
import { startRun, TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../support/wait-for.js';

// /metrics after a known sequence of runs, tasks and deliveries: every listed series is exposed,
// and its values are the ones the sequence must produce.

const METRICS_TOKEN = 'metrics-token-for-the-test-0123456789';

let keel: TestKeel;
let receiver: HookReceiver;
let clientToken = '';

type Sample = { name: string; labels: Record<string, string>; value: number };

function parse(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$/.exec(line);
    if (!match) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const label of (match[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[label[1]!] = label[2]!;
    samples.push({ name: match[1]!, labels, value: Number(match[3]) });
  }
  return samples;
}

async function scrape(): Promise<{ samples: Sample[]; value: (name: string, labels?: Record<string, string>) => number | undefined }> {
  const response = await fetch(`${keel.url}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } });
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toContain('text/plain');
  const samples = parse(await response.text());
  const value = (name: string, labels: Record<string, string> = {}) =>
    samples.find((sample) => sample.name === name && Object.keys(labels).length === Object.keys(sample.labels).length && Object.entries(labels).every(([key, wanted]) => sample.labels[key] === wanted))?.value;
  return { samples, value };
}

let pushTaskId = '';
let waitingTaskId = '';

beforeAll(async () => {
  receiver = await startHookReceiver([503, 200]);
  keel = await startTestKeel({
    overrides: {
      ...LOOPBACK_PUSH_OVERRIDES,
      KEEL_METRICS_TOKEN: METRICS_TOKEN,
      KEEL_MAINTENANCE_SWEEP_SECONDS: '3600',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com' } }] }, { reply: 'mail handled' }] },
        broken: { type: 'scripted', steps: [{ fail: 'client_error' }] },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'mailer', name: 'Mailer', provider: 'mailer', tools: ['send_email'] },
        { id: 'broken', name: 'Broken', provider: 'broken' },
      ],
    },
  });
  const client = await createClient(keel.context.pool, 'metrics-client');
  if (!client.ok) throw new Error('client');
  clientToken = client.token;

  // The sequence: 3 tasks completed (one pushing to a receiver that answers 503 once), a run that
  // fails (not_retryable), a run cancelled while it waits, a task waiting for approval.
  await sendWithPush(keel, clientToken, 'echo', 'one', null, false);
  await sendWithPush(keel, clientToken, 'echo', 'two', null, false);
  pushTaskId = await sendWithPush(keel, clientToken, 'echo', 'three', { id: 'hook', url: receiver.url, credentials: 'metrics-credential-1', token: 'metrics-token-1' }, false);
  await waitForRunStatus(keel.context.pool, await startRun(keel, 'broken', 'fails'), ['failed']);
  const cancelled = await startRun(keel, 'mailer', 'cancelled while waiting');
  await waitForRunStatus(keel.context.pool, cancelled, ['waiting_for_approval']);
  await cancelRun(keel.context.pool, silentLogger(), cancelled);
  waitingTaskId = await sendWithPush(keel, clientToken, 'mailer', 'waits', null, true);
  await waitForRunStatus(keel.context.pool, waitingTaskId, ['waiting_for_approval']);
  // Every delivery made, every revision projected.
  await waitFor(
    async () =>
      (await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT count(*)::int AS n FROM push_deliveries WHERE state <> 'delivered'`)) === 0 &&
      (await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`
        SELECT count(*)::int AS n FROM a2a_tasks t JOIN runs r ON r.id = t.run_id WHERE r.revision > t.projected_revision`)) === 0,
    'deliveries and projections to settle',
  );
});
afterAll(async () => {
  await keel?.dispose();
  await receiver?.close();
});

describe('/metrics', () => {
  it('needs the configured token', async () => {
    expect((await fetch(`${keel.url}/metrics`)).status).toBe(401);
    expect((await fetch(`${keel.url}/metrics`, { headers: { authorization: 'Bearer wrong-token-wrong-token-wrong' } })).status).toBe(401);
  });

  it('counts runs by status and reason, and tasks by state', async () => {
    const { value } = await scrape();
    expect(value('keel_runs', { status: 'completed', termination_reason: 'completed' })).toBe(3);
    expect(value('keel_runs', { status: 'failed', termination_reason: 'not_retryable' })).toBe(1);
    expect(value('keel_runs', { status: 'cancelled', termination_reason: 'cancelled' })).toBe(1);
    expect(value('keel_runs', { status: 'waiting_for_approval', termination_reason: '' })).toBe(1);
    expect(value('keel_runs', { status: 'queued', termination_reason: '' })).toBe(0);
    expect(value('keel_runs', { status: 'failed', termination_reason: 'approval_denied' })).toBe(0);
    expect(value('keel_tasks', { state: 'TASK_STATE_COMPLETED' })).toBe(3);
    expect(value('keel_tasks', { state: 'TASK_STATE_WORKING' })).toBe(1);
    expect(value('keel_tasks', { state: 'TASK_STATE_FAILED' })).toBe(0);
    expect(value('keel_tasks', { state: 'TASK_STATE_AUTH_REQUIRED' })).toBe(0);
  });

  it('counts deliveries and attempts by outcome class, and the delay from commit to delivery', async () => {
    const deliveries = await keel.context.pool.any(sql.type(z.object({ delay: z.number() }))`
      SELECT extract(epoch FROM d.ended_at - e.created_at)::float8 AS delay
      FROM push_deliveries d JOIN a2a_events e ON e.task_id = d.task_id AND e.sequence = d.event_sequence
      WHERE d.task_id = ${pushTaskId}`);
    expect(deliveries.length).toBeGreaterThanOrEqual(2);
    const { value } = await scrape();
    expect(value('keel_push_configs', { state: 'active' })).toBe(1);
    expect(value('keel_push_configs', { state: 'paused' })).toBe(0);
    expect(value('keel_push_deliveries', { state: 'delivered' })).toBe(deliveries.length);
    expect(value('keel_push_deliveries', { state: 'pending' })).toBe(0);
    // The receiver answered 503 once: one retry, then every event delivered.
    expect(value('keel_push_delivery_attempts', { outcome: 'retry' })).toBe(1);
    expect(value('keel_push_delivery_attempts', { outcome: 'delivered' })).toBe(deliveries.length);
    expect(value('keel_push_delivery_attempts', { outcome: 'paused' })).toBe(0);
    expect(value('keel_push_delivery_attempts', { outcome: 'stopped' })).toBe(0);
    expect(value('keel_push_delivery_attempts', { outcome: 'dead' })).toBe(0);
    expect(receiver.requests.map((request) => request.status)).toEqual([503, ...deliveries.map(() => 200)]);

    expect(value('keel_push_delivery_delay_seconds_count')).toBe(deliveries.length);
    expect(value('keel_push_delivery_delay_seconds_bucket', { le: '+Inf' })).toBe(deliveries.length);
    for (const bound of DELAY_BUCKETS) {
      expect(value('keel_push_delivery_delay_seconds_bucket', { le: String(bound) }), `le=${bound}`).toBe(deliveries.filter((row) => Math.max(0, row.delay) <= bound).length);
    }
    const sum = deliveries.reduce((total, row) => total + Math.max(0, row.delay), 0);
    expect(value('keel_push_delivery_delay_seconds_sum')).toBeCloseTo(sum, 3);
    expect(sum).toBeGreaterThan(0);
  });

  it('reports projector lag as committed minus projected revisions of open tasks', async () => {
    let { value } = await scrape();
    expect(value('keel_projector_lag_revisions')).toBe(0);
    expect(value('keel_projector_lag_tasks')).toBe(0);
    // Three revisions committed and not projected (nothing wakes the projector for this write).
    await keel.context.pool.query(sql.unsafe`UPDATE runs SET revision = revision + 3 WHERE id = ${waitingTaskId}`);
    ({ value } = await scrape());
    expect(value('keel_projector_lag_revisions')).toBe(3);
    expect(value('keel_projector_lag_tasks')).toBe(1);
  });

  it('counts inbox callbacks not processed yet', async () => {
    expect((await scrape()).value('keel_inbox_pending')).toBe(0);
    const dependency = randomUUID();
    const registration = randomUUID();
    await keel.context.pool.transaction(async (transaction) => {
      await transaction.query(sql.unsafe`
        INSERT INTO dependencies (id, run_id, tool_call_id, tool_name, remote_agent, state, next_poll_at)
        VALUES (${dependency}, ${waitingTaskId}, 'call-metrics', 'remote_agent', 'translator', 'waiting', now() + interval '1 hour')`);
      await transaction.query(sql.unsafe`INSERT INTO inbox_registrations (id, dependency_id, credential_hash) VALUES (${registration}, ${dependency}, ${sql.binary(Buffer.alloc(32))})`);
      for (const processed of [false, false, true]) {
        await transaction.query(sql.unsafe`
          INSERT INTO inbox_callbacks (id, registration_id, body, kind, processed_at)
          VALUES (${randomUUID()}, ${registration}, ${sql.binary(Buffer.from('sealed'))}, 'statusUpdate', ${processed ? sql.fragment`now()` : null})`);
      }
    });
    expect((await scrape()).value('keel_inbox_pending')).toBe(2);
  });

  it('reports queue depth and age per queue', async () => {
    const inbox = keel.context.queues.queue('inbox');
    await inbox.pause();
    try {
      await inbox.add('inbox', { dependencyId: randomUUID() }, { jobId: 'metrics-test-1' });
      await inbox.add('inbox', { dependencyId: randomUUID() }, { jobId: 'metrics-test-2' });
      await new Promise((resolve) => setTimeout(resolve, 1200));
      const { value } = await scrape();
      expect(value('keel_queue_depth', { queue: 'inbox' })).toBe(2);
      expect((value('keel_queue_jobs', { queue: 'inbox', state: 'waiting' }) ?? 0) + (value('keel_queue_jobs', { queue: 'inbox', state: 'paused' }) ?? 0)).toBe(2);
      expect(value('keel_queue_oldest_waiting_seconds', { queue: 'inbox' })).toBeGreaterThanOrEqual(1);
      expect(value('keel_queue_oldest_waiting_seconds', { queue: 'inbox' })).toBeLessThan(30);
      for (const name of QUEUE_NAMES) {
        const counts = await keel.context.queues.queue(name).getJobCounts(...(['waiting', 'paused', 'prioritized', 'delayed'] as never[]));
        expect(value('keel_queue_depth', { queue: name }), name).toBe((counts.waiting ?? 0) + (counts.paused ?? 0) + (counts.prioritized ?? 0) + (counts.delayed ?? 0));
        expect(value('keel_queue_oldest_waiting_seconds', { queue: name }), name).toBeDefined();
      }
    } finally {
      for (const id of ['metrics-test-1', 'metrics-test-2']) await (await inbox.getJob(id))?.remove();
      await inbox.resume();
    }
  });

  it('times HTTP requests by route pattern and status', async () => {
    await fetch(`${keel.url}/no-such-path/${randomUUID()}`);
    await fetch(`${keel.url}/ui/login`);
    const { value, samples } = await scrape();
    // Four SendMessage calls over JSON-RPC, all on one route pattern whatever the agent.
    expect(value('keel_http_request_duration_seconds_count', { method: 'POST', route: '/a2a/:agent', status_code: '200' })).toBe(4);
    expect(value('keel_http_request_duration_seconds_count', { method: 'GET', route: 'unmatched', status_code: '404' })).toBe(1);
    expect(value('keel_http_request_duration_seconds_count', { method: 'GET', route: '/ui/login', status_code: '200' })).toBe(1);
    expect(value('keel_http_request_duration_seconds_bucket', { method: 'POST', route: '/a2a/:agent', status_code: '200', le: '+Inf' })).toBe(4);
    expect(value('keel_http_request_duration_seconds_sum', { method: 'POST', route: '/a2a/:agent', status_code: '200' })).toBeGreaterThan(0);
    // No raw URL becomes a label.
    expect(samples.some((sample) => (sample.labels.route ?? '').includes('no-such-path'))).toBe(false);
    expect(samples.some((sample) => /[0-9a-f]{8}-[0-9a-f]{4}/.test(sample.labels.route ?? ''))).toBe(false);
  });
});
