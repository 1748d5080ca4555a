import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';

// A stream that ended keeps its connection for another request for 5 s only (src/a2a/sse.ts): a
// client that never comes back does not hold it until the keep-alive timeout. A client that does
// come back keeps it: the connection is closed only when no request came on it since the stream
// ended. Seen in bench:a2a's streaming mode: a client sending streams back to back on one
// connection had it reset under a request it had just sent (ECONNRESET), whenever an earlier
// stream's 5 s ran out in the moment between two of its requests.

/** How long an ended stream's connection waits for another request (ENDED_STREAM_KEEP_ALIVE_MS). */
const ENDED_STREAM_KEEP_ALIVE_MS = 5_000;

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel();
  const created = await createClient(keel.context.pool, 'stream-connection');
  if (!created.ok) throw new Error('client');
  token = created.token;
});
afterAll(async () => {
  await keel?.dispose();
});

/** A client of one connection (kept as long as the server keeps it), counting its connects and disconnects. */
function oneConnection() {
  const client = new Client(keel.url, { keepAliveTimeout: 60_000, keepAliveMaxTimeout: 60_000, keepAliveTimeoutThreshold: 0 });
  const counts = { connects: 0, disconnects: 0 };
  client.on('connect', () => (counts.connects += 1));
  client.on('disconnect', () => (counts.disconnects += 1));
  return { client, counts };
}

/** One SendStreamingMessage over HTTP+JSON, read to its end; when it ended. */
async function streamOnce(client: Client): Promise<number> {
  const stream = await client.request({
    method: 'POST',
    path: '/a2a/echo/message:stream',
    headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/a2a+json' },
    body: JSON.stringify({ message: { messageId: randomUUID(), role: 'ROLE_USER', parts: [{ text: 'hello' }] } }),
  });
  expect(stream.statusCode).toBe(200);
  expect(await stream.body.text()).toContain('TASK_STATE_COMPLETED');
  return Date.now();
}

async function ready(client: Client): Promise<void> {
  const answer = await client.request({ method: 'GET', path: '/readyz' });
  expect(answer.statusCode).toBe(200);
  await answer.body.text();
}

describe("an ended stream's connection", () => {
  it('stays open past the 5 s when the client sent another request on it meanwhile, and is closed when it did not', async () => {
    const returning = oneConnection();
    const gone = oneConnection();
    try {
      const [endedAt] = await Promise.all([streamOnce(returning.client), streamOnce(gone.client)]);
      // Back a second later with a request of another kind, which ends at once: the connection is
      // idle again when the stream's 5 s run out.
      await sleep(1_000);
      await ready(returning.client);

      await sleep(Math.max(0, endedAt! + ENDED_STREAM_KEEP_ALIVE_MS + 1_000 - Date.now()));
      expect(returning.counts.disconnects, 'the returning client keeps its connection').toBe(0);
      expect(gone.counts.disconnects, 'the one that did not come back has lost it').toBe(1);
      await ready(returning.client);
      expect(returning.counts.connects, 'every request of the returning client on its one connection').toBe(1);
    } finally {
      await Promise.all([returning.client.close(), gone.client.close()]);
    }
  });
});
