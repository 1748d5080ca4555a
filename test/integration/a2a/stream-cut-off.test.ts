import { Agent, request as httpRequest } from 'node:http';
import type { Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { takeSseEvents } from '../../support/sse.js';
import { cutOffs, floodProvider, liveMemoryMb, sseSubscribeRequest, stalledSseSubscriber, startFloodTask, tcpSocket, type StalledSubscriber } from '../../support/stream-flood.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';

// Stream backpressure over SSE (docs/reliability.md, "Large tasks"; decision 0059): a subscriber
// that stops reading while its task emits far more than a2a.streams.maxBufferedBytes is cut off
// after a2a.streams.stallTimeoutSeconds (counted, its connection reset: Keel holds no socket for
// it, and it received a bounded share of the task), while readers of the same task get every
// event, their streams end after the last one and their connections close a few seconds later.
// Comment lines (a2a.streams.keepAliveSeconds, short here) fall between events, never inside a
// 1 MB event written in slices. About 20 s: the flood task's 6 MB take most of it to be written.

const STALL_SECONDS = 2;
const CHUNKS = 6;
const CHUNK_CHARS = 1_000_000;
const PAYLOAD_BYTES = CHUNKS * CHUNK_CHARS;
/** Non-reading subscribers, alternately on HTTP+JSON and JSON-RPC. */
const STALLED = 24;
/** How long a stream's connection is kept after the stream ended (src/a2a/sse.ts), and the slack on a loaded machine. */
const ENDED_KEEP_ALIVE_MS = 5_000;
const SLACK_MS = 7_000;

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let keel: TestKeel;
let token: string;
let port: number;
const sockets: Socket[] = [];

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_A2A_STREAMS_STALL_TIMEOUT_SECONDS: String(STALL_SECONDS),
      // Comment lines go out often, so many fall while an event is being written in slices.
      KEEL_A2A_STREAMS_KEEP_ALIVE_SECONDS: '0.1',
      KEEL_PROVIDERS: { flood: floodProvider(CHUNKS, CHUNK_CHARS, 2000) },
      KEEL_AGENTS: [{ id: 'flood', name: 'Flood', provider: 'flood', tools: ['lookup'], limits: { maxIterations: CHUNKS + 2 }, privacy: { answerLevel: 'full' } }],
    },
  });
  const created = await createClient(keel.context.pool, 'stream-cut-off');
  if (!created.ok) throw new Error('no client');
  token = created.token;
  port = Number(new URL(keel.url).port);
});

afterAll(async () => {
  for (const socket of sockets) socket.destroy();
  await keel?.dispose();
});

const a2aHeaders = () => ({ authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' });

function stalledSubscriber(taskId: string, jsonRpc: boolean): Promise<StalledSubscriber> {
  return stalledSseSubscriber({ port, token, agent: 'flood', taskId, jsonRpc, sockets });
}

type Reading = { events: Json[]; ids: number[]; endedAt: number; closedAt: Promise<number> };

/**
 * A subscriber that reads everything, over a keep-alive connection of its own: the stream's
 * events (parsed as they come, the JSON-RPC envelope taken off), when the response ended and when
 * Keel closed the connection. `attached` resolves with its first event (the task's snapshot).
 */
function readingSubscriber(taskId: string, jsonRpc: boolean): { attached: Promise<void>; read: Promise<Reading> } {
  const { method, path, body } = sseSubscribeRequest('flood', taskId, jsonRpc);
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  let attach: () => void = () => undefined;
  const attached = new Promise<void>((resolve) => (attach = resolve));
  const read = new Promise<Reading>((resolve, reject) => {
    const request = httpRequest({ host: '127.0.0.1', port, method, path, headers: a2aHeaders(), agent }, (response) => {
      expect(response.statusCode).toBe(200);
      const socket = response.socket;
      const closedAt = new Promise<number>((settle) => socket.once('close', () => settle(performance.now())));
      const events: Json[] = [];
      const ids: number[] = [];
      let buffer = '';
      response.setEncoding('utf8');
      response.on('data', (text: string) => {
        buffer += text;
        // An event ends with a blank line: a chunk without a line feed ends none (and a 1 MB
        // event comes in many chunks, each not worth a scan of what came before).
        if (!text.includes('\n')) return;
        let parsed: ReturnType<typeof takeSseEvents>;
        try {
          parsed = takeSseEvents(buffer);
        } catch (error) {
          // An event whose data is not JSON (e.g. split by a comment line): noted, and the rest skipped.
          events.push({ corrupt: String(error).slice(0, 200) });
          buffer = '';
          return;
        }
        buffer = parsed.rest;
        if (parsed.events.length > 0) attach();
        for (const event of parsed.events) {
          ids.push(event.id ?? -1);
          const data = event.data as Json;
          const item = (jsonRpc ? data.result : data) as Json;
          // Only what the assertions need is kept: the artifacts' ids and sizes, the states.
          if (item.artifactUpdate) events.push({ artifact: item.artifactUpdate.artifact.artifactId, chars: item.artifactUpdate.artifact.parts[0].text.length });
          else if (item.statusUpdate) events.push({ state: item.statusUpdate.status.state });
          else if (item.task) events.push({ task: item.task.status.state, artifacts: (item.task.artifacts ?? []).map((artifact: Json) => artifact.artifactId) });
          else events.push({ other: Object.keys(item) });
        }
      });
      response.on('end', () => resolve({ events, ids, endedAt: performance.now(), closedAt }));
      response.on('error', reject);
    });
    request.on('error', reject);
    request.end(body);
  });
  return { attached, read };
}

/**
 * Two readers of the task, one per binding, attached before its first artifact. (A subscriber
 * that attaches later misses the artifacts before it: a WORKING task's snapshot has none, as the
 * task row holds artifacts from the run's completion on, and its stream starts after the events
 * journaled so far.)
 */
async function attachReaders(taskId: string): Promise<Array<Promise<Reading>>> {
  const readers = [readingSubscriber(taskId, false), readingSubscriber(taskId, true)];
  await Promise.all(readers.map((reader) => reader.attached));
  return readers.map((reader) => reader.read);
}

/** Checks what the readers of a flood task got: every event in order, each artifact once, the completion last. */
async function expectEveryEvent(reads: Reading[], taskId: string): Promise<void> {
  const finalTask = (await (await fetch(`${keel.url}/a2a/flood/tasks/${taskId}`, { headers: a2aHeaders() })).json()) as Json;
  const finalArtifacts = finalTask.artifacts as Json[];
  expect(finalArtifacts).toHaveLength(CHUNKS + 1);
  expect(finalArtifacts.filter((artifact) => artifact.parts[0].text.length === CHUNK_CHARS)).toHaveLength(CHUNKS);
  for (const read of reads) {
    // Every event parses: the comment lines sent meanwhile fell between events, never inside one.
    expect(read.events.filter((event) => event.corrupt !== undefined)).toEqual([]);
    expect(read.ids).toEqual([...read.ids].sort((a, b) => a - b));
    const first = read.events[0]!;
    expect(first.task).toBeDefined();
    const streamed = read.events.filter((event) => event.artifact !== undefined);
    // The snapshot's artifacts and the streamed ones are the task's, each once: the 1 MB chunks and the answer.
    const artifacts = [...first.artifacts, ...streamed.map((event) => event.artifact)];
    expect(artifacts).toEqual(finalArtifacts.map((artifact) => artifact.artifactId));
    for (const event of streamed) expect(event.chars).toBe(finalArtifacts.find((artifact) => artifact.artifactId === event.artifact)!.parts[0].text.length);
    expect(read.events.at(-1)).toEqual({ state: 'TASK_STATE_COMPLETED' });
  }
}

/** Keel closes a reader's connection a few seconds after its stream ended (it cannot carry another request before). */
async function expectClosedAfterEnd(reads: Reading[]): Promise<void> {
  for (const read of reads) expect((await read.closedAt) - read.endedAt).toBeLessThan(ENDED_KEEP_ALIVE_MS + SLACK_MS);
}

describe('SSE stream backpressure', () => {
  it('readers of a task get every event, their streams end after the last and Keel closes their connections', { timeout: 40_000 }, async () => {
    const before = { stalled: await cutOffs(keel.url, 'sse', 'stalled'), unflushed: await cutOffs(keel.url, 'sse', 'unflushed_end') };
    const taskId = await startFloodTask(keel.url, token);
    const reads = await Promise.all(await attachReaders(taskId));
    await expectEveryEvent(reads, taskId);
    await expectClosedAfterEnd(reads);
    // Nobody was cut off: the readers took everything.
    expect({ stalled: await cutOffs(keel.url, 'sse', 'stalled'), unflushed: await cutOffs(keel.url, 'sse', 'unflushed_end') }).toEqual(before);
  });

  it('subscribers that stop reading are cut off and reset, with bounded memory, while readers of the same task get every event', { timeout: 60_000 }, async () => {
    const stalledBefore = await cutOffs(keel.url, 'sse', 'stalled');
    const unflushedBefore = await cutOffs(keel.url, 'sse', 'unflushed_end');
    const liveBefore = liveMemoryMb();
    const taskId = await startFloodTask(keel.url, token);
    const readers = await attachReaders(taskId);
    const stalled = await Promise.all(Array.from({ length: STALLED }, (_, index) => stalledSubscriber(taskId, index % 2 === 1)));
    for (const subscriber of stalled) expect(subscriber.head).toMatch(/^HTTP\/1\.1 200/);

    // Memory, when the first stream is cut off (the others have stalled about as long and hold
    // what they hold): far less than a copy of the payload per stalled stream.
    await waitFor(async () => (await cutOffs(keel.url, 'sse', 'stalled')) > stalledBefore, 'a first SSE stream to be cut off', 40_000, 100);
    const growthMb = liveMemoryMb() - liveBefore;
    // Every non-reading stream is cut off as stalled: its buffer stayed full for the stall time.
    await waitFor(async () => (await cutOffs(keel.url, 'sse', 'stalled')) - stalledBefore >= STALLED, `${STALLED} SSE streams to be cut off as stalled`, 20_000, 100);
    // Keel holds no socket for them: reset, not waiting behind the bytes the client does not take.
    // The clients' sockets are gone from the kernel's table too, as after a reset (a FIN would
    // leave them CLOSE_WAIT), though their processes have not closed them.
    await waitFor(async () => stalled.every((subscriber) => tcpSocket(port, subscriber.localPort) === null), "Keel's side of the stalled connections to be gone", 5_000);
    for (const subscriber of stalled) expect(tcpSocket(subscriber.localPort, port)).toBeNull();

    // The readers got every event of the task, unharmed by the stalled streams beside them.
    const reads = await Promise.all(readers);
    await expectEveryEvent(reads, taskId);

    // A stalled client that reads again finds its connection ended, having got a bounded share of
    // the task: what its own kernel had taken before its window closed, nothing queued behind it.
    for (const subscriber of stalled) subscriber.socket.resume();
    const endings = await Promise.all(stalled.map((subscriber) => subscriber.ended));
    const received = stalled.map((subscriber) => subscriber.received());
    console.log(`stream cut-off (sse): ${STALLED} stalled subscribers received ${(Math.max(...received) / 1024).toFixed(0)} KiB at most of ${(PAYLOAD_BYTES / 1e6).toFixed(0)} MB; endings ${[...new Set(endings)].join(', ')}; live memory ${growthMb.toFixed(0)} MB above the start at the first cut-off`);
    for (const ending of endings) expect(['ECONNRESET', 'close']).toContain(ending);
    for (const bytes of received) expect(bytes).toBeLessThan(PAYLOAD_BYTES / 10);
    expect(growthMb).toBeLessThan((STALLED * PAYLOAD_BYTES) / 1024 / 1024 / 2);

    // Nobody else was cut off: the readers took their last bytes.
    expect(await cutOffs(keel.url, 'sse', 'unflushed_end')).toBe(unflushedBefore);
    expect((await cutOffs(keel.url, 'sse', 'stalled')) - stalledBefore).toBe(STALLED);
  });
});
