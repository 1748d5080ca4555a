import type { Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { cutOffs, floodProvider, stalledSseSubscriber, startFloodTask, tcpSocket, type StalledSubscriber } from '../../support/stream-flood.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';

// SSE streams whose task ends while their clients read nothing (issue 40: "the connections stay
// open after the task ended"; docs/reliability.md, "Streams end with their task"). A stream whose
// last bytes all went to the kernel is ended, and Keel lets its connection go 5 s later: the
// client, reading again, gets the whole response and a FIN. A stream whose last bytes are still in
// Keel's buffer (a2a.streams.maxBufferedBytes is large here, so it never waits for room) gives the
// client the stall time to take them, then is cut off as `unflushed_end` and reset.

const STALL_SECONDS = 2;
const SUBSCRIBERS = 4;
/** The small task: 768 KiB, all of it taken by the kernel's buffers of a connection that is not read. */
const SMALL = { chunks: 3, chunkChars: 256 * 1024 };
/** The large task: 6 MB, more than the kernel's buffers take (about 4 MB on loopback), less than the stream's bound. */
const LARGE = { chunks: 6, chunkChars: 1_000_000 };
const MAX_BUFFERED_BYTES = 8 * 1024 * 1024;
/** How long a stream's connection is kept after the stream ended (src/a2a/sse.ts), and the slack on a loaded machine. */
const ENDED_KEEP_ALIVE_MS = 5_000;
const SLACK_MS = 7_000;

let keel: TestKeel;
let token: string;
let port: number;
const sockets: Socket[] = [];

beforeAll(async () => {
  const agent = (id: string, chunks: number) => ({ id, name: id, provider: id, tools: ['lookup'], limits: { maxIterations: chunks + 2 }, privacy: { answerLevel: 'full' } });
  keel = await startTestKeel({
    overrides: {
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_A2A_STREAMS_STALL_TIMEOUT_SECONDS: String(STALL_SECONDS),
      KEEL_A2A_STREAMS_MAX_BUFFERED_BYTES: String(MAX_BUFFERED_BYTES),
      KEEL_PROVIDERS: { small: floodProvider(SMALL.chunks, SMALL.chunkChars, 1500), large: floodProvider(LARGE.chunks, LARGE.chunkChars, 1500) },
      KEEL_AGENTS: [agent('small', SMALL.chunks), agent('large', LARGE.chunks)],
    },
  });
  const created = await createClient(keel.context.pool, 'stream-end-unread');
  if (!created.ok) throw new Error('no client');
  token = created.token;
  port = Number(new URL(keel.url).port);
});

afterAll(async () => {
  for (const socket of sockets) socket.destroy();
  await keel?.dispose();
});

async function subscribers(agent: string, taskId: string): Promise<StalledSubscriber[]> {
  const attached = await Promise.all(Array.from({ length: SUBSCRIBERS }, (_, index) => stalledSseSubscriber({ port, token, agent, taskId, jsonRpc: index % 2 === 1, sockets })));
  for (const subscriber of attached) expect(subscriber.head).toMatch(/^HTTP\/1\.1 200/);
  return attached;
}

async function completion(agent: string, taskId: string): Promise<number> {
  await waitFor(
    async () => {
      const response = await fetch(`${keel.url}/a2a/${agent}/tasks/${taskId}?historyLength=0`, { headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0' } });
      return ((await response.json()) as { status: { state: string } }).status.state === 'TASK_STATE_COMPLETED';
    },
    `task ${taskId} to complete`,
    30_000,
    100,
  );
  return performance.now();
}

/** Whether Keel's process still holds its side of a subscriber's connection (an orphan the kernel still sends from is not held). */
const keelHolds = (subscriber: StalledSubscriber) => (tcpSocket(port, subscriber.localPort)?.inode ?? 0) !== 0;

const counts = async () => ({ stalled: await cutOffs(keel.url, 'sse', 'stalled'), unflushed: await cutOffs(keel.url, 'sse', 'unflushed_end') });

describe('SSE streams of clients that do not read, when their task ends', () => {
  it('a stream whose bytes all reached the kernel ends; Keel lets the connection go within seconds and the client, reading again, gets the whole response', { timeout: 40_000 }, async () => {
    const before = await counts();
    const taskId = await startFloodTask(keel.url, token, 'small');
    const attached = await subscribers('small', taskId);
    const completedAt = await completion('small', taskId);
    await waitFor(async () => attached.every((subscriber) => !keelHolds(subscriber)), 'Keel to let the ended streams’ connections go', ENDED_KEEP_ALIVE_MS + SLACK_MS, 100);
    console.log(`stream end (sse): ${SUBSCRIBERS} non-reading connections let go ${((performance.now() - completedAt) / 1000).toFixed(1)} s after the task completed`);
    // Not cut off: the streams ended whole.
    expect(await counts()).toEqual(before);
    for (const subscriber of attached) subscriber.socket.resume();
    const endings = await Promise.all(attached.map((subscriber) => subscriber.ended));
    expect(endings).toEqual(attached.map(() => 'close'));
    for (const subscriber of attached) {
      expect(subscriber.received()).toBeGreaterThan(SMALL.chunks * SMALL.chunkChars);
      // The last event is the completion, and the chunked response is terminated.
      expect(subscriber.tail()).toContain('TASK_STATE_COMPLETED');
      expect(subscriber.tail().endsWith('\r\n0\r\n\r\n')).toBe(true);
    }
  });

  it('a stream whose last bytes are still in Keel when it ends is cut off as unflushed_end after the stall time and reset', { timeout: 40_000 }, async () => {
    const before = await counts();
    const taskId = await startFloodTask(keel.url, token, 'large');
    const attached = await subscribers('large', taskId);
    await completion('large', taskId);
    await waitFor(async () => (await counts()).unflushed - before.unflushed >= SUBSCRIBERS, `${SUBSCRIBERS} streams to be cut off as unflushed_end`, 20_000, 100);
    expect((await counts()).stalled).toBe(before.stalled);
    // Reset: gone from the kernel's table on both sides, though the clients have not closed their sockets.
    await waitFor(async () => attached.every((subscriber) => tcpSocket(port, subscriber.localPort) === null), 'Keel’s side of the connections to be gone', 5_000);
    for (const subscriber of attached) expect(tcpSocket(subscriber.localPort, port)).toBeNull();
    for (const subscriber of attached) subscriber.socket.resume();
    await Promise.all(attached.map((subscriber) => subscriber.ended));
    for (const subscriber of attached) expect(subscriber.received()).toBeLessThan(LARGE.chunks * LARGE.chunkChars);
  });
});
