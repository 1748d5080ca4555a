import { GetTaskRequest, Task } from '@a2a-js/sdk';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { MasterKeyRing, parseMasterKey } from '../../src/sealing/master-key.js';
import { createSealer, type Sealer } from '../../src/sealing/sealer.js';
import { taskColumnContext } from '../../src/tasks/task-repository.js';
import { sdkClient, textMessage, type Binding } from '../support/a2a-client.js';
import { TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// Task.history over the official client: the client's messages and the agent's status messages in
// the order they happened, the INPUT_REQUIRED prompts included (docs/decisions/0012), stored
// sealed at the task's answer level and nowhere in plain text.

const EMAIL = 'alice@example.com';
const PROMPT = `Which address? ${EMAIL} or another one?`;

let keel: TestKeel;
let token = '';
/** Opens rows with the master key alone, as an auditor with the key would. */
let auditor: Sealer;

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        conformance: { type: 'conformance', streamTimeoutSeconds: 1 },
        asks: { type: 'scripted', steps: [{ toolCalls: [{ name: 'ask_with_prompt', arguments: { prompt: PROMPT } }] }, { reply: 'noted' }] },
      },
      KEEL_AGENTS: [
        { id: 'conformance', name: 'Conformance', provider: 'conformance', limits: { maxIterations: 10 } },
        { id: 'asks', name: 'Asks', provider: 'asks', tools: ['ask_with_prompt'] },
        { id: 'asks-redacted', name: 'Asks (redacted)', provider: 'asks', tools: ['ask_with_prompt'], privacy: { answerLevel: 'redacted' } },
      ],
    },
  });
  const client = await createClient(keel.context.pool, 'history');
  if (!client.ok) throw new Error('client');
  token = client.token;
  const key = parseMasterKey(keel.masterKey);
  if (!key.ok) throw new Error(key.error);
  auditor = createSealer(new MasterKeyRing([key.key]));
});
afterAll(async () => {
  await keel?.dispose();
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const unique = (prefix: string) => `${prefix}-${Math.random().toString(36).slice(2)}`;
/** History as `ROLE: text` lines, in order. */
const outline = (history: Json[] | undefined) => (history ?? []).map((message) => `${message.role}: ${message.parts.map((part: Json) => part.text ?? '').join('')}`);

async function send(client: Awaited<ReturnType<typeof sdkClient>>, text: string, extra: { taskId?: string; messageId?: string } = {}): Promise<Json> {
  return Task.toJSON((await client.sendMessage(textMessage(text, extra))) as Task) as Json;
}

async function getTask(client: Awaited<ReturnType<typeof sdkClient>>, id: string, historyLength?: number): Promise<Json> {
  return Task.toJSON((await client.getTask(GetTaskRequest.fromJSON({ id, ...(historyLength === undefined ? {} : { historyLength }) }))) as Task) as Json;
}

/** The stored history column: its raw bytes and what it holds opened with the master key. */
async function storedHistory(taskId: string): Promise<{ raw: Buffer; opened: Json[] }> {
  const raw = await keel.context.pool.oneFirst(sql.type(z.object({ history: z.instanceof(Buffer) }))`SELECT history FROM a2a_tasks WHERE id = ${taskId}`);
  const opened = auditor.openJson<Json[]>(taskColumnContext(taskId, 'history'), raw);
  if (!opened.ok) throw new Error(`history of ${taskId} cannot be opened: ${opened.reason}`);
  return { raw, opened: opened.value };
}

describe.each<Binding>(['JSONRPC', 'HTTP+JSON'])('Task.history over %s', (binding) => {
  it('holds the user message, the INPUT_REQUIRED prompt, the reply and the final status message, in order', async () => {
    const client = await sdkClient(keel.url, 'conformance', token, binding);
    const created = await send(client, 'start', { messageId: unique('tck-input-required') });
    expect(created.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    // While the task waits, the prompt is its status message and the last history entry.
    expect(outline((await getTask(client, created.id)).history)).toEqual(['ROLE_USER: start', 'ROLE_AGENT: Input required by TCK']);

    const done = await send(client, 'my reply', { taskId: created.id, messageId: unique('tck-complete-task') });
    expect(done.status.state).toBe('TASK_STATE_COMPLETED');

    const read = await getTask(client, created.id, 10);
    expect(outline(read.history)).toEqual(['ROLE_USER: start', 'ROLE_AGENT: Input required by TCK', 'ROLE_USER: my reply', 'ROLE_AGENT: Hello from TCK']);
    for (const message of read.history) expect(message).toMatchObject({ taskId: created.id, contextId: created.contextId });
    // The prompt in history is the message the task showed while it waited.
    expect(read.history[1]).toEqual(created.status.message ? { ...created.status.message, contextId: created.contextId } : undefined);
    expect(new Set(read.history.map((message: Json) => message.messageId)).size).toBe(4);
    expect(outline((await getTask(client, created.id, 2)).history)).toEqual(['ROLE_USER: my reply', 'ROLE_AGENT: Hello from TCK']);

    const stored = await storedHistory(created.id);
    expect(stored.raw.includes('Input required by TCK'), 'the stored history is sealed, not plain text').toBe(false);
    expect(stored.raw.includes('my reply')).toBe(false);
    expect(outline(stored.opened)).toEqual(outline(read.history));
  });

  it('holds every prompt of a task that asks twice', async () => {
    const client = await sdkClient(keel.url, 'conformance', token, binding);
    const created = await send(client, 'start', { messageId: unique('tck-input-required') });
    const again = await send(client, 'more', { taskId: created.id, messageId: unique('tck-input-required') });
    expect(again.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    await send(client, 'done', { taskId: created.id, messageId: unique('tck-complete-task') });

    expect(outline((await getTask(client, created.id, 100)).history)).toEqual([
      'ROLE_USER: start',
      'ROLE_AGENT: Input required by TCK',
      'ROLE_USER: more',
      'ROLE_AGENT: Input required by TCK',
      'ROLE_USER: done',
      'ROLE_AGENT: Hello from TCK',
    ]);
  });

  it("holds a tool's prompt; an answer given as an artifact stays out of history", async () => {
    const client = await sdkClient(keel.url, 'asks', token, binding);
    const created = await send(client, 'write to someone');
    expect(created.status).toMatchObject({ state: 'TASK_STATE_INPUT_REQUIRED', message: { parts: [{ text: PROMPT }] } });
    await send(client, 'the first one', { taskId: created.id });

    const read = await getTask(client, created.id, 10);
    expect(read.status.state).toBe('TASK_STATE_COMPLETED');
    expect(outline(read.history)).toEqual(['ROLE_USER: write to someone', `ROLE_AGENT: ${PROMPT}`, 'ROLE_USER: the first one']);
    expect(read.artifacts.flatMap((artifact: Json) => artifact.parts.map((part: Json) => part.text))).toContain('noted');
    const stored = await storedHistory(created.id);
    expect(stored.raw.includes(EMAIL)).toBe(false);
  });

  it('keeps the prompt at the answer level: redacted in history and in the row', async () => {
    const client = await sdkClient(keel.url, 'asks-redacted', token, binding);
    const created = await send(client, 'write to someone');
    expect(created.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    const read = await getTask(client, created.id);
    expect(outline(read.history)).toEqual(['ROLE_USER: write to someone', 'ROLE_AGENT: Which address? *** or another one?']);
    const stored = await storedHistory(created.id);
    expect(JSON.stringify(stored.opened)).not.toContain(EMAIL);
    expect(outline(stored.opened)).toEqual(outline(read.history));
  });
});
