import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../../src/auth/client-repository.js';
import { decideApproval, readSuspendedRun } from '../../../src/runs/resume-run.js';
import { getRun } from '../../../src/runs/run-repository.js';
import { codeFor } from '../../fixtures/statecharts/sealed.machine.js';
import { sdkClient } from '../../support/a2a-client.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { TEST_REDIS_URL, testQueueKind } from '../../support/test-queues.js';
import { waitFor, waitForRunStatus } from '../../support/wait-for.js';

// Sealed snapshots (issue 16, "Durable, transition by transition"; tests: "No plaintext of the
// input or of a step's output in a database dump"): a statechart run's every committed snapshot
// holds its context (the message, a step's output, the client's reply, the approval it waits
// for). A plain pg_dump of the whole database, taken while the run waits for an approval and again
// once it completed, must show none of them, in text or as the hex of a bytea, while the task
// stays readable over A2A.
//
// The installation's level is `full` and the `sealed` agent tightens its audit to `metadata`: the
// loosest installation, so nothing but the run's own ceilings keeps content out. The `audited`
// agent keeps a full audit trail, whose events hold content as it was (run_events, by design): it
// is the dump search's positive control, and it shows that outside the audit trail its content is
// sealed too.

const QUEUE = testQueueKind();
const MACHINE = new URL('../../fixtures/statecharts/sealed.machine.ts', import.meta.url).pathname;
const run = promisify(execFile);

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_AGENTS: [
        { id: 'sealed', name: 'Sealed', machine: MACHINE, privacy: { auditLevel: 'metadata' } },
        { id: 'audited', name: 'Audited', machine: MACHINE },
      ],
    },
  });
  const client = await createClient(keel.context.pool, 'sealed-snapshots');
  if (!client.ok) throw new Error('cannot create the client');
  token = client.token;
});
afterAll(async () => {
  await keel?.dispose();
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
const asJson = (result: unknown) => Task.toJSON(result as Task) as Json;

/** A plain-text dump of the whole database (schema and data), as an operator's backup would be. */
async function dumpDatabase(): Promise<string> {
  const { stdout } = await run('pg_dump', ['--dbname', keel.databaseUrl, '--no-owner', '--no-privileges'], { maxBuffer: 512 * 1024 * 1024 });
  return stdout;
}

/** Where a string occurs in a dump: the tables whose data (COPY block) holds it, or `schema` for any other line. */
function placesOf(dump: string, needle: string): string[] {
  const hex = Buffer.from(needle, 'utf8').toString('hex');
  const places = new Set<string>();
  let table: string | null = null;
  for (const line of dump.split('\n')) {
    const copy = /^COPY ([^ ]+) \(/.exec(line);
    if (copy) {
      table = copy[1]!;
      continue;
    }
    if (line === '\\.') {
      table = null;
      continue;
    }
    if (line.includes(needle)) places.add(table ?? 'schema');
    if (line.toLowerCase().includes(hex)) places.add(`${table ?? 'schema'} (hex)`);
  }
  return [...places].sort();
}

type Secrets = { input: string; code: string; reply: string };

/** Drives one task of an agent: the message, the reply to the machine's question, an approval. */
async function driveTask(agent: string, secrets: Secrets, onApprovalWait: (taskId: string) => Promise<void>): Promise<Json> {
  const client = await sdkClient(keel.url, agent, token);
  const asked = asJson(
    await client.sendMessage(SendMessageRequest.fromJSON({ message: { messageId: `${agent}-1`, role: 'ROLE_USER', parts: [{ text: `${secrets.input} release it` }] } })),
  );
  expect(asked.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
  expect(asked.status.message.parts[0].text).toBe('Confirm the release?');
  await client.sendMessage(
    SendMessageRequest.fromJSON({
      message: { messageId: `${agent}-2`, role: 'ROLE_USER', taskId: asked.id, contextId: asked.contextId, parts: [{ text: secrets.reply }] },
      configuration: { returnImmediately: true },
    }),
  );
  const suspended = await waitFor(async () => {
    const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, asked.id, 'waiting_for_approval');
    return read.ok ? read.view : null;
  }, 'the run to wait for an approval');
  // Sealed is not lost: opened with the key, the waiting snapshot holds all of it.
  const pending = suspended.state.pendingApproval;
  expect(pending?.kind === 'tools' && pending.calls[0]!.arguments).toEqual({ summary: `release ${secrets.code}`, code: secrets.code, reply: secrets.reply });
  await onApprovalWait(asked.id);
  expect((await decideApproval(keel.context, asked.id, pending!.digest, true)).ok).toBe(true);
  await waitForRunStatus(keel.context.pool, asked.id, ['completed', 'failed', 'cancelled']);
  return asJson(await client.getTask({ id: asked.id, historyLength: 10 } as never));
}

/**
 * Everything the Redis queue backend holds under this Keel's prefix, as text (on the Postgres
 * backend the queues are tables of the dumped database). Jobs carry ids only.
 */
async function redisContent(): Promise<string> {
  const redis = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 1 });
  const chunks: string[] = [];
  try {
    for (let cursor = '0'; ; ) {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${keel.config.queue.prefix}:*`, 'COUNT', 500);
      for (const key of keys) {
        const type = await redis.type(key);
        if (type === 'string') chunks.push(String(await redis.get(key)));
        else if (type === 'hash') chunks.push(JSON.stringify(await redis.hgetall(key)));
        else if (type === 'list') chunks.push(JSON.stringify(await redis.lrange(key, 0, -1)));
        else if (type === 'set') chunks.push(JSON.stringify(await redis.smembers(key)));
        else if (type === 'zset') chunks.push(JSON.stringify(await redis.zrange(key, 0, -1)));
        else if (type === 'stream') chunks.push(JSON.stringify(await redis.xrange(key, '-', '+')));
      }
      cursor = next;
      if (cursor === '0') break;
    }
  } finally {
    await redis.quit();
  }
  return chunks.join('\n');
}

function expectReadable(task: Json, secrets: Secrets): void {
  expect(task.status.state).toBe('TASK_STATE_COMPLETED');
  const artifacts = task.artifacts as Json[];
  expect(artifacts.find((artifact) => artifact.name === 'code')!.parts[0].text).toBe(secrets.code);
  expect(artifacts.find((artifact) => artifact.name === 'answer')!.parts[0].text).toBe(`released ${secrets.code} (${secrets.reply}) for ${secrets.input} release it`);
  expect(artifacts.find((artifact) => artifact.name === 'result')!.parts[0].data).toEqual({ code: secrets.code, reply: secrets.reply });
  const said = (task.history as Json[]).flatMap((message) => (message.parts as Json[]).map((part) => part.text)).join('\n');
  expect(said).toContain(secrets.input);
  expect(said).toContain(secrets.reply);
}

describe(`sealed statechart snapshots on the ${QUEUE} queue backend`, () => {
  it('no dump of the database shows the input, a step output or the reply of a run audited at metadata; A2A reads them all', async () => {
    const secrets: Secrets = { input: 'PLAINTEXT-INPUT-7731', code: codeFor('PLAINTEXT-INPUT-7731 release it'), reply: 'CONFIRM-REPLY-3390' };
    const dumps: string[] = [];
    const task = await driveTask('sealed', secrets, async () => {
      dumps.push(await dumpDatabase());
    });
    dumps.push(await dumpDatabase());
    const row = (await getRun(keel.context.pool, task.id))!;
    expect(row).toMatchObject({ status: 'completed', audit_level: 'metadata', answer_level: 'full', machine_state: 'done' });

    for (const dump of dumps) {
      // The dump is what it seems: it holds this run, its path through the machine (state names only) and its sealed rows.
      expect(dump).toContain(task.id);
      expect(dump).toMatch(/COPY public\.run_machine_steps /);
      expect(dump).toContain('"approving"');
      for (const secret of Object.values(secrets)) expect(placesOf(dump, secret), secret).toEqual([]);
    }
    if (QUEUE === 'redis') {
      const queued = await redisContent();
      expect(queued).toContain(task.id);
      for (const secret of Object.values(secrets)) expect(queued).not.toContain(secret);
    }
    expectReadable(task, secrets);
  });

  it('a full audit trail holds content in run_events only (the positive control of the search): snapshots, outputs and journal stay sealed', async () => {
    const secrets: Secrets = { input: 'AUDITED-INPUT-4417', code: codeFor('AUDITED-INPUT-4417 release it'), reply: 'AUDITED-REPLY-8826' };
    const dumps: string[] = [];
    const task = await driveTask('audited', secrets, async () => {
      dumps.push(await dumpDatabase());
    });
    dumps.push(await dumpDatabase());
    expect(await getRun(keel.context.pool, task.id)).toMatchObject({ status: 'completed', audit_level: 'full', answer_level: 'full' });

    for (const dump of dumps) {
      // The lookup's audit events hold its arguments (the input) and its result (the code), the
      // input_received event the reply; no other table holds any of them.
      for (const secret of Object.values(secrets)) expect(placesOf(dump, secret), secret).toEqual(['public.run_events']);
    }
    expectReadable(task, secrets);
  });
});
