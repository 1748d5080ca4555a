import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { GetTaskRequest, ListTasksRequest, StreamResponse, SubscribeToTaskRequest, Task } from '@a2a-js/sdk';
import type { Client } from '@a2a-js/sdk/client';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SEQUENCED_EVENTS_URI } from '../../src/a2a/sequenced-events.js';
import { createClient } from '../../src/auth/client-repository.js';
import { readJournal, scrubTaskJournal } from '../../src/tasks/journal.js';
import { sdkClient, textMessage, type Binding } from '../support/a2a-client.js';
import { grpcMetadata, rawGrpcClient, rawUnary, sdkFailure } from '../support/grpc-client.js';
import { TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { readSse } from '../support/sse.js';
import { createEmptyDatabase } from '../support/test-database.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../support/wait-for.js';

// The sequenced-events extension (docs/extensions/sequenced-events.md) as a client sees it, on the
// three bindings with the official client where it can (raw HTTP where it cannot: SSE ids, the
// params' resume point, error bodies): the card declares it; activated, every event carries its
// sequence, GetTask its last one, and SubscribeToTask resumes after any number with the Task first
// and then exactly the events of the full stream after it; a point past the journal or before a
// removed event is refused with RESUME_POINT_UNAVAILABLE; pushes carry the numbers; a client that
// does not activate it sees plain A2A 1.0. A resume also works on another Keel after a restart.

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;

const overrides = {
  KEEL_GRPC_PORT: '0',
  KEEL_PRIVACY_LEVEL: 'full',
  KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
  KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
  KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
  KEEL_PROVIDERS: {
    steps: {
      type: 'scripted',
      steps: [
        { artifact: { artifactId: 'draft', name: 'draft', text: 'part one ' }, toolCalls: [{ name: 'lookup', arguments: {} }] },
        { artifact: { artifactId: 'draft', text: 'part two', append: true, lastChunk: true }, toolCalls: [{ name: 'lookup', arguments: {} }] },
        { reply: 'all steps done' },
      ],
    },
    asker: {
      type: 'scripted',
      steps: [
        { artifact: { artifactId: 'notes', name: 'notes', text: 'thinking' }, toolCalls: [{ name: 'lookup', arguments: {} }] },
        { toolCalls: [{ name: 'ask_user', arguments: {} }] },
        { artifact: { artifactId: 'notes', text: ' and done', append: true, lastChunk: true }, toolCalls: [{ name: 'lookup', arguments: {} }] },
        { reply: 'red it is' },
      ],
    },
  },
  KEEL_AGENTS: [
    { id: 'steps', name: 'Steps', provider: 'steps', tools: ['lookup'] },
    { id: 'asker', name: 'Asker', provider: 'asker', tools: ['lookup', 'ask_user'] },
  ],
};

const BINDINGS: readonly Binding[] = ['JSONRPC', 'HTTP+JSON', 'GRPC'];
const ACTIVATE = { 'A2A-Extensions': SEQUENCED_EVENTS_URI };
const RESUME_ERROR = 'RESUME_POINT_UNAVAILABLE';

type Delivery = { headers: IncomingHttpHeaders; body: Json };

let database: Awaited<ReturnType<typeof createEmptyDatabase>>;
let keel: TestKeel;
let token = '';
let receiver: Server;
let hookUrl = '';
const deliveries: Delivery[] = [];
const masterKey = Buffer.alloc(32, 4).toString('base64');

const start = () => startTestKeel({ databaseUrl: database.url, env: { KEEL_MASTER_KEY: masterKey }, overrides });

beforeAll(async () => {
  database = await createEmptyDatabase();
  keel = await start();
  const client = await createClient(keel.context.pool, 'sequenced');
  if (!client.ok) throw new Error('client');
  token = client.token;
  receiver = createServer((request, response) => {
    let raw = '';
    request.on('data', (chunk: Buffer) => (raw += chunk.toString('utf8')));
    request.on('end', () => {
      deliveries.push({ headers: request.headers, body: JSON.parse(raw) });
      response.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  hookUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
});
afterAll(async () => {
  await new Promise((resolve) => receiver?.close(resolve));
  await keel?.dispose();
  await database?.drop();
});

const client = (binding: Binding): Promise<Client> => sdkClient(keel.url, 'steps', token, binding);
const headers = (extra: Record<string, string> = {}) => ({ 'content-type': 'application/json', 'a2a-version': '1.0', authorization: `Bearer ${token}`, ...extra });

async function eventsJson(events: AsyncGenerator<StreamResponse>): Promise<Json[]> {
  const out: Json[] = [];
  for await (const event of events) out.push(StreamResponse.toJSON(event));
  return out;
}

/** The extension's entry of an event (or a Task's) metadata. */
const entryOf = (response: Json): Json => {
  const [kind, value] = Object.entries(response)[0] as [string, Json];
  void kind;
  return value.metadata?.[SEQUENCED_EVENTS_URI];
};

/** A completed task's full stream with the extension activated: the Task as created, then every event. */
async function completedTask(binding: Binding): Promise<{ taskId: string; full: Json[] }> {
  const full = await eventsJson((await client(binding)).sendMessageStream(textMessage(`full ${binding}`), { serviceParameters: ACTIVATE }));
  const taskId = full[0].task.id as string;
  await waitForRunStatus(keel.context.pool, taskId, ['completed']);
  return { taskId, full };
}

/** SubscribeToTask with the extension, resumed after `after`: by Last-Event-ID (HTTP) or `last-event-id` metadata (gRPC), through the official client. */
async function resumeWithSdk(binding: Binding, taskId: string, after: number, on: TestKeel = keel): Promise<Json[]> {
  const sdk = await sdkClient(on.url, 'steps', token, binding);
  return eventsJson(sdk.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: taskId }), { serviceParameters: { ...ACTIVATE, 'Last-Event-ID': String(after) } }));
}

/** Checks a resume after `after` against the full stream: the Task now, then exactly the full stream's events after it. */
function expectResumed(resumed: Json[], full: Json[], after: number, lastSequence: number): void {
  expect(resumed[0].task, `the resume after ${after} starts with the Task`).toBeDefined();
  expect(entryOf(resumed[0])).toEqual({ lastSequence });
  expect(resumed[0].task.status.state).toBe('TASK_STATE_COMPLETED');
  const expected = full.slice(1).filter((event) => entryOf(event).sequence > after);
  expect(resumed.slice(1)).toEqual(expected);
}

describe('the agent card', () => {
  it('declares the extension, not required, for every agent', async () => {
    const card = (await (await fetch(`${keel.url}/a2a/steps/.well-known/agent-card.json`)).json()) as Json;
    expect(card.capabilities.extensions).toContainEqual({ uri: SEQUENCED_EVENTS_URI, description: expect.any(String), required: false });
  });
});

describe.each(BINDINGS)('over %s', (binding) => {
  it('numbers every streamed event and GetTask; resumes from random points with the Task first, nothing missing, twice or changed', async () => {
    const { taskId, full } = await completedTask(binding);
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    const last = journal[journal.length - 1]!.sequence;
    // The Task as created reflects nothing yet; every event after it carries its journal sequence.
    expect(entryOf(full[0])).toEqual({ lastSequence: 0 });
    expect(full.slice(1).map((event) => entryOf(event).sequence)).toEqual(journal.map((event) => event.sequence));
    expect(full[full.length - 1].statusUpdate.status.state).toBe('TASK_STATE_COMPLETED');

    const task = Task.toJSON((await (await client(binding)).getTask(GetTaskRequest.fromJSON({ id: taskId }), { serviceParameters: ACTIVATE })) as Task) as Json;
    expect(task.metadata[SEQUENCED_EVENTS_URI]).toEqual({ lastSequence: last });

    const points = new Set([0, last, ...Array.from({ length: 3 }, () => Math.floor(Math.random() * last))]);
    for (const after of points) expectResumed(await resumeWithSdk(binding, taskId, after), full, after, last);
  });

  it('refuses a resume point past the journal, and one whose next events were removed, naming the earliest point', async () => {
    const { taskId } = await completedTask(binding);
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    const last = journal[journal.length - 1]!.sequence;
    const beyond = await refusal(binding, taskId, last + 5);
    expect(beyond).toMatchObject({ taskId, afterSequence: String(last + 5), earliestAfterSequence: '0', lastSequence: String(last) });

    // A ceiling tightened to `metadata` removes the artifact events (decision 0014): a resume
    // before the last removed one would skip events; from it on, nothing is missing.
    await scrubTaskJournal(keel.context.pool, keel.context.sealer, taskId, 'metadata');
    const kept = new Set((await readJournal(keel.context.pool, keel.context.sealer, taskId, 0)).map((event) => event.sequence));
    const removed = journal.map((event) => event.sequence).filter((sequence) => !kept.has(sequence));
    expect(removed.length).toBeGreaterThan(0);
    const lastRemoved = Math.max(...removed);
    expect(await refusal(binding, taskId, removed[0]! - 1)).toMatchObject({ taskId, earliestAfterSequence: String(lastRemoved), lastSequence: String(last) });
    const resumed = await resumeWithSdk(binding, taskId, lastRemoved);
    expect(resumed.slice(1).map((event) => entryOf(event).sequence)).toEqual([...kept].filter((sequence) => sequence > lastRemoved));
  });

  it('shows a client that does not activate it plain A2A 1.0', async () => {
    const sdk = await client(binding);
    const streamed = await eventsJson(sdk.sendMessageStream(textMessage(`plain ${binding}`)));
    const taskId = streamed[0].task.id as string;
    await waitForRunStatus(keel.context.pool, taskId, ['completed']);
    const read = Task.toJSON((await sdk.getTask(GetTaskRequest.fromJSON({ id: taskId }))) as Task);
    expect(JSON.stringify([streamed, read])).not.toContain(SEQUENCED_EVENTS_URI);
  });
});

/** The ErrorInfo metadata of a refused resume, checked in each binding's shape (raw HTTP, the official gRPC client). */
async function refusal(binding: Binding, taskId: string, after: number): Promise<Record<string, string>> {
  if (binding === 'GRPC') {
    const error = await sdkFailure((await client('GRPC')).resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: taskId }), { serviceParameters: { ...ACTIVATE, 'last-event-id': String(after) } }));
    expect(error.code).toBe(GrpcStatus.OUT_OF_RANGE);
    expect(error.reason).toBe(RESUME_ERROR);
    return error.errorMetadata;
  }
  if (binding === 'HTTP+JSON') {
    const response = await fetch(`${keel.url}/a2a/steps/tasks/${taskId}:subscribe`, { method: 'POST', headers: headers({ ...ACTIVATE, 'last-event-id': String(after) }) });
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toContain('application/json');
    const body = (await response.json()) as Json;
    expect(body.error).toMatchObject({ code: 400, status: 'OUT_OF_RANGE' });
    expect(body.error.details[0]).toMatchObject({ reason: RESUME_ERROR, domain: 'a2a-protocol.org' });
    return body.error.details[0].metadata;
  }
  // JSON-RPC: the resume point as a parameter of the call.
  const response = await fetch(`${keel.url}/a2a/steps`, {
    method: 'POST',
    headers: headers(ACTIVATE),
    body: JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'SubscribeToTask', params: { id: taskId, metadata: { [SEQUENCED_EVENTS_URI]: { afterSequence: after } } } }),
  });
  const body = (await response.json()) as Json;
  expect(body.error).toMatchObject({ code: -32030 });
  expect(body.error.data[0]).toMatchObject({ reason: RESUME_ERROR });
  return body.error.data[0].metadata;
}

describe('a live task', () => {
  it("resumed while it waits for input, each binding's subscription replays, stays open at the replayed INPUT_REQUIRED, and follows to the end", async () => {
    const sdk = await sdkClient(keel.url, 'asker', token, 'JSONRPC');
    const created = Task.toJSON((await sdk.sendMessage(textMessage('pick a colour', { returnImmediately: true }))) as Task) as Json;
    const taskId = created.id as string;
    // The question is in the journal (projected after the run's status).
    const asking = await waitFor(async () => {
      const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
      const last = journal[journal.length - 1];
      return last?.state === 'TASK_STATE_INPUT_REQUIRED' ? last.sequence : null;
    }, 'the INPUT_REQUIRED event');
    // Each binding resumes from its own random point before the question; its replay is read in full before the answer is sent.
    const streams = await Promise.all(
      BINDINGS.map(async (binding) => {
        const after = Math.floor(Math.random() * asking);
        const subscriber = await sdkClient(keel.url, 'asker', token, binding);
        const stream = subscriber.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: taskId }), { serviceParameters: { ...ACTIVATE, 'Last-Event-ID': String(after) } });
        const events = stream[Symbol.asyncIterator]();
        const replayed: Json[] = [];
        while (replayed.length < 1 + asking - after) replayed.push(StreamResponse.toJSON((await events.next()).value as StreamResponse));
        return { binding, after, events, replayed };
      }),
    );
    const answer = await fetch(`${keel.url}/a2a/asker`, {
      method: 'POST',
      headers: headers(),
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'SendMessage', params: { message: { messageId: 'colour', role: 'ROLE_USER', taskId, parts: [{ data: { colour: 'red' } }] } } }),
    });
    expect(((await answer.json()) as Json).result.task.status.state).toBe('TASK_STATE_COMPLETED');
    const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
    for (const { binding, after, events, replayed } of streams) {
      const rest: Json[] = [];
      for (let next = await events.next(); !next.done; next = await events.next()) rest.push(StreamResponse.toJSON(next.value as StreamResponse));
      const [first, ...following] = [...replayed, ...rest];
      expect(first.task.status.state, binding).toBe('TASK_STATE_INPUT_REQUIRED');
      expect(entryOf(first)).toEqual({ lastSequence: asking });
      expect(following.map((event) => entryOf(event).sequence), `${binding} after ${after}`).toEqual(journal.map((event) => event.sequence).filter((sequence) => sequence > after));
      expect(following[following.length - 1].statusUpdate.status.state).toBe('TASK_STATE_COMPLETED');
    }
  });
});

describe('the wire', () => {
  it('echoes the activated extension (also when asked by its 0.3 name) and only then', async () => {
    const read = async (extra: Record<string, string>) => fetch(`${keel.url}/a2a/steps/tasks?pageSize=1`, { headers: headers(extra) });
    expect((await read(ACTIVATE)).headers.get('a2a-extensions')).toBe(SEQUENCED_EVENTS_URI);
    expect((await read({ 'X-A2A-Extensions': SEQUENCED_EVENTS_URI })).headers.get('a2a-extensions')).toBe(SEQUENCED_EVENTS_URI);
    expect((await read({})).headers.get('a2a-extensions')).toBeNull();
    // A stream's headers too, and gRPC's initial metadata.
    const stream = async (extra: Record<string, string>) => {
      const response = await fetch(`${keel.url}/a2a/steps/message:stream`, {
        method: 'POST',
        headers: headers(extra),
        body: JSON.stringify({ message: { messageId: `echo-${Math.random()}`, role: 'ROLE_USER', parts: [{ text: 'echo' }] } }),
      });
      await readSse(response);
      return response.headers.get('a2a-extensions');
    };
    expect(await stream(ACTIVATE)).toBe(SEQUENCED_EVENTS_URI);
    expect(await stream({})).toBeNull();
    const raw = rawGrpcClient(keel.grpcAddress!);
    try {
      const metadata = (extra: Record<string, string>) => grpcMetadata({ authorization: `Bearer ${token}`, 'a2a-version': '1.0', ...extra });
      const list = ListTasksRequest.fromJSON({ tenant: 'steps', pageSize: 1 });
      expect((await rawUnary(raw, 'listTasks', list, metadata({ 'a2a-extensions': SEQUENCED_EVENTS_URI }))).headers.get('a2a-extensions')).toEqual([SEQUENCED_EVENTS_URI]);
      expect((await rawUnary(raw, 'listTasks', list, metadata({}))).headers.get('a2a-extensions')).toEqual([]);
    } finally {
      raw.close();
    }
  });

  it("gives a blocking SendMessage's Task its last sequence, over every binding", async () => {
    for (const binding of BINDINGS) {
      const sdk = await client(binding);
      const task = Task.toJSON((await sdk.sendMessage(textMessage(`blocking ${binding}`), { serviceParameters: ACTIVATE })) as Task) as Json;
      const journal = await readJournal(keel.context.pool, keel.context.sealer, task.id, 0);
      expect(task.metadata[SEQUENCED_EVENTS_URI]).toEqual({ lastSequence: journal[journal.length - 1]!.sequence });
      const plain = Task.toJSON((await sdk.sendMessage(textMessage(`blocking plain ${binding}`))) as Task);
      expect(JSON.stringify(plain)).not.toContain(SEQUENCED_EVENTS_URI);
    }
  });

  it('takes the resume point as a JSON-RPC parameter: SSE ids, the Task under the resume point, then the events after it', async () => {
    const { taskId, full } = await completedTask('JSONRPC');
    const last = entryOf(full[full.length - 1]).sequence as number;
    const after = Math.max(1, last - 3);
    const frames = await readSse(
      await fetch(`${keel.url}/a2a/steps`, {
        method: 'POST',
        headers: headers(ACTIVATE),
        body: JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'SubscribeToTask', params: { id: taskId, metadata: { [SEQUENCED_EVENTS_URI]: { afterSequence: after } } } }),
      }),
    );
    // The Task's SSE id is the resume point: a client that loses this stream too resumes from there.
    expect(frames.map((frame) => frame.id)).toEqual([after, ...Array.from({ length: last - after }, (_, index) => after + 1 + index)]);
    // In the official client's JSON form, as the full stream was read.
    expectResumed(
      frames.map((frame) => StreamResponse.toJSON(StreamResponse.fromJSON((frame.data as Json).result))),
      full,
      after,
      last,
    );
  });

  it('refuses a resume point that is not a sequence number as invalid params', async () => {
    const { taskId } = await completedTask('JSONRPC');
    for (const afterSequence of [-1, 1.5, '3']) {
      const body = (await (
        await fetch(`${keel.url}/a2a/steps`, {
          method: 'POST',
          headers: headers(ACTIVATE),
          body: JSON.stringify({ jsonrpc: '2.0', id: 4, method: 'SubscribeToTask', params: { id: taskId, metadata: { [SEQUENCED_EVENTS_URI]: { afterSequence } } } }),
        })
      ).json()) as Json;
      expect(body.error.code).toBe(-32602);
      expect(body.error.data[1].fieldViolations[0].field).toBe(`metadata.${SEQUENCED_EVENTS_URI}.afterSequence`);
    }
  });
});

describe('push deliveries', () => {
  it('carry the sequence in X-A2A-Event-Sequence always, in the body for a config of the extension; deduplicated by it, each event arrives once', async () => {
    const send = async (text: string, extra: Record<string, string>) => {
      const response = await fetch(`${keel.url}/a2a/steps`, {
        method: 'POST',
        headers: headers(extra),
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 1,
          method: 'SendMessage',
          params: { message: { messageId: `push-${text}`, role: 'ROLE_USER', parts: [{ text }] }, configuration: { returnImmediately: true, taskPushNotificationConfig: { url: hookUrl } } },
        }),
      });
      return ((await response.json()) as Json).result.task.id as string;
    };
    const [sequenced, plain] = [await send('sequenced', ACTIVATE), await send('plain', {})];
    for (const taskId of [sequenced, plain]) {
      await waitForRunStatus(keel.context.pool, taskId, ['completed']);
      const journal = await readJournal(keel.context.pool, keel.context.sealer, taskId, 0);
      const mine = await waitFor(async () => {
        const got = deliveries.filter((delivery) => taskOf(delivery.body) === taskId);
        return new Set(got.map((delivery) => delivery.headers['x-a2a-event-sequence'])).size >= journal.length ? got : null;
      }, `the deliveries of ${taskId}`);
      const byNumber = new Map(mine.map((delivery) => [Number(delivery.headers['x-a2a-event-sequence']), delivery.body]));
      expect([...byNumber.keys()].sort((a, b) => a - b)).toEqual(journal.map((event) => event.sequence));
      for (const event of journal) {
        const body = byNumber.get(event.sequence);
        if (taskId === sequenced) expect(entryOf(body)).toEqual({ sequence: event.sequence });
        else expect(JSON.stringify(body)).not.toContain(SEQUENCED_EVENTS_URI);
      }
    }
  });
});

const taskOf = (body: Json): string | undefined => body.statusUpdate?.taskId ?? body.artifactUpdate?.taskId ?? body.task?.id ?? body.message?.taskId;

describe('across a restart', () => {
  it('a resume on a new Keel over the same database misses nothing', async () => {
    const runs = await Promise.all(BINDINGS.map(async (binding) => ({ binding, ...(await completedTask(binding)) })));
    await keel.stop();
    keel = await start();
    for (const { binding, taskId, full } of runs) {
      const last = entryOf(full[full.length - 1]).sequence as number;
      const after = Math.floor(Math.random() * last);
      expectResumed(await resumeWithSdk(binding, taskId, after), full, after, last);
    }
  });
});
