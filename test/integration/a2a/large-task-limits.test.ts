import { SendMessageRequest } from '@a2a-js/sdk';
import type { Client as GrpcClient } from '@grpc/grpc-js';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { decodeServiceError, grpcMetadata, rawGrpcClient, rawUnary } from '../../support/grpc-client.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { waitFor } from '../../support/wait-for.js';

// Large tasks (docs/reliability.md): a message over a2a.maxMessageBytes gets MESSAGE_TOO_LARGE,
// naming the limit, on all three bindings; an agent's artifact over a2a.maxArtifactBytes fails
// its run with a status that names the limit, and nothing of the artifact is written; a task
// revision is opened once for any number of concurrent GetTasks, and again after it changes.

const MAX_MESSAGE = 4096;
const MAX_ARTIFACT = 8192;
type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

let keel: TestKeel;
let token: string;
let grpc: GrpcClient;

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_GRPC_PORT: '0',
      KEEL_A2A_MAX_MESSAGE_BYTES: String(MAX_MESSAGE),
      KEEL_A2A_MAX_ARTIFACT_BYTES: String(MAX_ARTIFACT),
      KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        big: { type: 'scripted', steps: [{ reply: 'x'.repeat(MAX_ARTIFACT * 2) }] },
        'big-artifact': { type: 'scripted', steps: [{ artifact: { artifactId: 'huge', name: 'huge', text: 'y'.repeat(MAX_ARTIFACT * 2) }, reply: 'done' }] },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo', privacy: { answerLevel: 'full' } },
        { id: 'big', name: 'Big', provider: 'big', privacy: { answerLevel: 'full' } },
        { id: 'big-artifact', name: 'Big artifact', provider: 'big-artifact', privacy: { answerLevel: 'full' } },
      ],
    },
  });
  const created = await createClient(keel.context.pool, 'large-limits');
  if (!created.ok) throw new Error('no client');
  token = created.token;
  grpc = rawGrpcClient(keel.grpcAddress!);
});

afterAll(async () => {
  grpc?.close();
  await keel?.dispose();
});

const headers = () => ({ authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' });
const message = (text: string) => ({ messageId: `m-${Math.random()}`, role: 'ROLE_USER', parts: [{ text }] });

async function rpc(agent: string, method: string, params: unknown): Promise<Json> {
  const response = await fetch(`${keel.url}/a2a/${agent}`, { method: 'POST', headers: headers(), body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }) });
  return (await response.json()) as Json;
}

describe('a2a.maxMessageBytes', () => {
  const tooLarge = 'z'.repeat(MAX_MESSAGE + 10);

  it('JSON-RPC: MESSAGE_TOO_LARGE naming the limit, with the message size', async () => {
    const answer = await rpc('echo', 'SendMessage', { message: message(tooLarge) });
    expect(answer.error.code).toBe(-32602);
    expect(answer.error.message).toContain('a2a.maxMessageBytes');
    expect(answer.error.data[0]).toMatchObject({ reason: 'MESSAGE_TOO_LARGE', metadata: { limit: 'a2a.maxMessageBytes', maxBytes: String(MAX_MESSAGE) } });
    // The same for the streaming send, before any stream starts.
    const streamed = await rpc('echo', 'SendStreamingMessage', { message: message(tooLarge) });
    expect(streamed.error.data[0].reason).toBe('MESSAGE_TOO_LARGE');
    // A message within the limit is taken.
    expect((await rpc('echo', 'SendMessage', { message: message('small') })).result.task.status.state).toBe('TASK_STATE_COMPLETED');
  });

  it('HTTP+JSON: 413 with MESSAGE_TOO_LARGE', async () => {
    const response = await fetch(`${keel.url}/a2a/echo/message:send`, { method: 'POST', headers: headers(), body: JSON.stringify({ message: message(tooLarge) }) });
    expect(response.status).toBe(413);
    const body = (await response.json()) as Json;
    expect(body.error.status).toBe('INVALID_ARGUMENT');
    expect(body.error.message).toContain('a2a.maxMessageBytes');
    expect(body.error.details[0]).toMatchObject({ reason: 'MESSAGE_TOO_LARGE', metadata: { limit: 'a2a.maxMessageBytes' } });
  });

  it('gRPC: INVALID_ARGUMENT with MESSAGE_TOO_LARGE in the status details', async () => {
    const request = SendMessageRequest.fromJSON({ tenant: 'echo', message: { messageId: 'g1', role: 'ROLE_USER', parts: [{ text: tooLarge }] } });
    const outcome = await rawUnary(grpc, 'sendMessage', request, grpcMetadata({ authorization: `Bearer ${token}`, 'a2a-version': '1.0' }));
    const decoded = decodeServiceError(outcome.error);
    expect(decoded.code).toBe(3);
    expect(decoded.reason).toBe('MESSAGE_TOO_LARGE');
    expect(decoded.message).toContain('a2a.maxMessageBytes');
    expect(decoded.errorMetadata.limit).toBe('a2a.maxMessageBytes');
  });
});

describe('a2a.maxArtifactBytes', () => {
  for (const agent of ['big', 'big-artifact']) {
    it(`${agent}: the run fails naming the limit, and no artifact is written`, async () => {
      const answer = await rpc(agent, 'SendMessage', { message: message('go') });
      const task = answer.result.task as Json;
      expect(task.status.state).toBe('TASK_STATE_FAILED');
      expect(task.status.message.parts[0].text).toContain('a2a.maxArtifactBytes');
      expect(task.artifacts).toBeUndefined();
      const outputs = await keel.context.pool.oneFirst(sql.type(z.object({ count: z.number() }))`SELECT count(*)::int AS count FROM run_outputs WHERE run_id = ${task.id as string}`);
      expect(outputs).toBe(0);
    });
  }
});

describe('task revisions shared by concurrent readers', () => {
  it('100 concurrent GetTasks open a revision once; a new revision is opened again, and each historyLength is its own view', async () => {
    const sent = await rpc('echo', 'SendMessage', { message: message('q'.repeat(3000)) });
    const taskId = sent.result.task.id as string;
    const before = await openedCount();
    const answers = await Promise.all(
      Array.from({ length: 100 }, (_, index) =>
        index % 2 === 0
          ? fetch(`${keel.url}/a2a/echo/tasks/${taskId}`, { headers: headers() }).then((response) => response.json() as Promise<Json>)
          : rpc('echo', 'GetTask', { id: taskId }).then((answer) => answer.result as Json),
      ),
    );
    expect(answers.every((task) => task.id === taskId && task.history.length === 1 && task.artifacts.length === 1)).toBe(true);
    expect((await openedCount()) - before).toBeLessThanOrEqual(1);
    // historyLength variants are views of the same revision.
    const last = (await rpc('echo', 'GetTask', { id: taskId, historyLength: 1 })).result as Json;
    expect(last.history).toHaveLength(1);
    expect(last.history[0].role).toBe('ROLE_USER');
    expect((await rpc('echo', 'GetTask', { id: taskId, historyLength: 0 })).result.history).toBeUndefined();
    expect((await openedCount()) - before).toBeLessThanOrEqual(1);
    // Another client sees nothing of it (ownership is checked per request, not per revision).
    const other = await createClient(keel.context.pool, 'large-limits-other');
    if (!other.ok) throw new Error('no client');
    const foreign = await fetch(`${keel.url}/a2a/echo/tasks/${taskId}`, { headers: { ...headers(), authorization: `Bearer ${other.token}` } });
    expect(foreign.status).toBe(404);
    // A new revision (the task's metadata changed by a write of the row) is opened again.
    await keel.context.pool.query(sql.unsafe`UPDATE a2a_tasks SET metadata = '{"touched": true}'::jsonb WHERE id = ${taskId}`);
    const changed = (await rpc('echo', 'GetTask', { id: taskId })).result as Json;
    expect(changed.metadata).toMatchObject({ touched: true });
    await waitFor(async () => (await openedCount()) - before === 2, 'the new revision to be opened once');
  });
});

async function openedCount(): Promise<number> {
  const metrics = await (await fetch(`${keel.url}/metrics`)).text();
  return Number(/^keel_a2a_task_revisions_opened (\d+)/m.exec(metrics)?.[1] ?? NaN);
}
