import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Task } from '@a2a-js/sdk';
import { createClient } from '../../../src/auth/client-repository.js';
import { readJournal } from '../../../src/tasks/journal.js';
import { sdkClient, textMessage } from '../../support/a2a-client.js';
import { adminSession } from '../../support/operator-ui.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';

// A statechart step that throws, unhandled by its machine: what the run's record and the client
// show of the error at a level that keeps content (redacted: the message masked) and at one that
// keeps none (metadata: a line that says so and names the setting that keeps it). One Keel at
// `redacted`; the second agent lowers its own audit level to `metadata`.

const MACHINE = new URL('../../fixtures/statecharts/failing.machine.ts', import.meta.url).pathname;
const STOPPED = "the agent's machine stopped: step pay failed and no transition handles its error: CardDeclined";

let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'redacted',
      KEEL_AGENTS: [
        { id: 'charges', name: 'Charges', machine: MACHINE },
        { id: 'charges-quietly', name: 'Charges quietly', machine: MACHINE, privacy: { auditLevel: 'metadata' } },
      ],
    },
  });
  const client = await createClient(keel.context.pool, 'step-failure');
  if (!client.ok) throw new Error('client');
  token = client.token;
});
afterAll(async () => keel?.dispose());

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
const asJson = (result: unknown) => Task.toJSON(result as Task) as Json;

async function failedTask(agent: string) {
  const client = await sdkClient(keel.url, agent, token);
  const task = asJson(await client.sendMessage(textMessage('alice@example.com')));
  expect(task.status.state).toBe('TASK_STATE_FAILED');
  const run = await keel.context.pool.one(sql.type(z.object({ error_class: z.string().nullable(), failure_detail: z.record(z.unknown()), audit_level: z.string() }))`
    SELECT error_class, failure_detail, audit_level FROM runs WHERE id = ${task.id}`);
  const event = await keel.context.pool.one(sql.type(z.object({ payload: z.record(z.unknown()) }))`
    SELECT payload FROM run_events WHERE run_id = ${task.id} AND kind = 'machine_error'`);
  const journal = await readJournal(keel.context.pool, keel.context.sealer, task.id, 0, 100);
  const failedEvent = journal.map((entry) => entry.response as Json).find((response) => response.statusUpdate?.status.state === 'TASK_STATE_FAILED');
  const session = await adminSession(keel);
  const page = await (await fetch(`${keel.url}/ui/runs/${task.id}`, { headers: { cookie: session.cookie } })).text();
  const stepError = /<span id="step-error">([^<]*)<\/span>/.exec(page)?.[1]?.replaceAll('&#39;', "'");
  const fetched = asJson(await client.getTask({ id: task.id } as never));
  return { task, fetched, run, event: event.payload, journaled: failedEvent?.statusUpdate.status.message.parts[0].text as string, stepError };
}

describe('a statechart step that throws', () => {
  it('where the audit level keeps content: its class and its message (masked at redacted), in the record and for the client', async () => {
    const { task, fetched, run, event, journaled, stepError } = await failedTask('charges');
    const text = `${STOPPED}: card declined for ***`;
    expect(task.status.message.parts[0].text).toBe(text);
    expect(fetched.status.message.parts[0].text).toBe(text);
    expect(journaled).toBe(text);
    expect(run.audit_level).toBe('redacted');
    expect(run.error_class).toBe('CardDeclined');
    // Stored in clear: names only.
    expect(run.failure_detail).toEqual({ reason: 'machine_error', state: 'charging', step: 'pay', errorClass: 'CardDeclined', error: 'step pay failed and no transition handles its error' });
    expect(event).toMatchObject({ step: 'pay', errorClass: 'CardDeclined', content: { message: 'card declined for ***' } });
    expect(stepError).toBe('step pay: CardDeclined: card declined for ***');
    expect(JSON.stringify([run, event, stepError])).not.toContain('alice@example.com');
  });

  it('at metadata: its class, and a line that the message was not kept and which setting keeps it', async () => {
    const { task, fetched, run, event, journaled, stepError } = await failedTask('charges-quietly');
    const notKept = 'its message is not kept at audit level metadata: set privacy.auditLevel of agent charges-quietly to redacted or full to keep it';
    expect(task.status.message.parts[0].text).toBe(`${STOPPED} (${notKept} (an agent's or a provider's privacy.auditLevel can only lower the installation's))`);
    expect(fetched.status.message.parts[0].text).toBe(task.status.message.parts[0].text);
    expect(journaled).toBe(task.status.message.parts[0].text);
    expect(run.audit_level).toBe('metadata');
    expect(run.error_class).toBe('CardDeclined');
    expect(event).toMatchObject({ step: 'pay', errorClass: 'CardDeclined' });
    expect(event.content).toBeUndefined();
    expect(String(event.message)).toContain(notKept);
    expect(stepError).toContain(`step pay: CardDeclined (${notKept}`);
    expect(JSON.stringify([task, run, event])).not.toContain('card declined');
  });
});
