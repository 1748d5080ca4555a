import { sql } from 'slonik';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { callA2A, expectA2AResult } from '../../support/a2a-wire.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { newClientToken } from '../push/push-support.js';

// runs.directWrites, the write path's switch for diagnosis: no fast path and no group commit.
// Every run takes the queue, every creation and completion is written by a statement or
// transaction of its own, and clients see the same answers.

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({ overrides: { KEEL_RUNS_DIRECT_WRITES: 'true', KEEL_PRIVACY_LEVEL: 'full' } });
  token = await newClientToken(keel.context.pool);
});
afterAll(async () => keel?.dispose());

/** The value of each sample of a metric, by its labels as written. */
async function samples(name: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${keel.url}/metrics`)).text();
  const values = new Map<string, number>();
  for (const line of text.split('\n')) {
    const match = new RegExp(`^${name}(\\{[^}]*\\})?\\s+(\\S+)$`).exec(line);
    if (match) values.set(match[1] ?? '', Number(match[2]));
  }
  return values;
}

describe('runs.directWrites', () => {
  it('answers concurrent blocking sends as usual, every run from the queue, every write alone', async () => {
    const texts = Array.from({ length: 12 }, (_, index) => `direct ${index}`);
    const answers = await Promise.all(
      texts.map(async (text) =>
        expectA2AResult(
          'JSONRPC',
          await callA2A(keel.url, 'echo', 'JSONRPC', 'SendMessage', { message: { messageId: `direct-${text}-${Date.now()}`, role: 'ROLE_USER', parts: [{ text }] } }, { token }),
        ),
      ),
    );
    for (const [index, answer] of answers.entries()) {
      const task = (answer as { task: { status: { state: string }; artifacts: Array<{ parts: Array<{ text: string }> }> } }).task;
      expect(task.status.state).toBe('TASK_STATE_COMPLETED');
      expect(task.artifacts[0]!.parts[0]!.text).toBe(`echo: ${texts[index]}`);
    }

    // No run was inserted claimed: each was created QUEUED and claimed later by the queue's worker.
    const runs = await keel.context.pool.any(sql.type(z.object({ fast: z.boolean() }))`SELECT started_at = created_at AS fast FROM runs`);
    expect(runs).toHaveLength(12);
    expect(runs.every((run) => !run.fast)).toBe(true);

    const started = await samples('keel_runs_started_total');
    expect(started.get('{path="queue"}')).toBe(12);
    expect(started.get('{path="fast"}') ?? 0).toBe(0);
    // Every group commit carried one write: the count of batches equals the count of batches of size 1.
    const sizes = await samples('keel_group_commit_batch_size_bucket');
    for (const kind of ['creation', 'completion']) {
      expect(sizes.get(`{le="1",kind="${kind}"}`), kind).toBe(12);
      expect(sizes.get(`{le="+Inf",kind="${kind}"}`), kind).toBe(12);
    }
  });
});
