import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { AMOUNT_PROMPT } from '../../examples/refund-agent/refund.machine.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { cliEnvFor, startTestKeel, tempDir, type TestKeel } from '../support/test-keel.js';
import { waitForRunStatus } from '../support/wait-for.js';

// The refund example (examples/refund-agent), a statechart agent, driven end to end by the
// official client: the model's classification has no amount, so the agent asks for it
// (INPUT_REQUIRED); the reply is above the limit, so it waits for an operator, who approves from
// the CLI; the refund tool runs once, and the result stays with the task after a later turn in
// its context.

const EXAMPLE = join(REPO_ROOT, 'examples/refund-agent');
const ledger = join(tempDir('keel-refund-'), 'ledger.jsonl');

let keel: TestKeel;
let token = '';
let env: NodeJS.ProcessEnv;
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });

beforeAll(async () => {
  process.env.REFUND_LEDGER = ledger;
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_TOOL_MODULES: JSON.stringify([join(EXAMPLE, 'tools.ts')]),
      KEEL_PROVIDERS: { 'refund-classifier': { type: 'scripted', steps: [{ reply: '{"amount": null, "reason": "the blender arrived broken"}', tokens: 12 }] } },
      KEEL_AGENTS: [{ id: 'refunds', name: 'Refunds', machine: join(EXAMPLE, 'refund.machine.ts'), provider: 'refund-classifier', tools: ['issue_refund'] }],
    },
  });
  const client = await createClient(keel.context.pool, 'refund-customer');
  if (!client.ok) throw new Error('client');
  token = client.token;
  env = cleanEnv(cliEnvFor(keel));
});
afterAll(async () => {
  await keel?.dispose();
  // Test files share a process (vitest.config.ts: isolate false): the next file starts clean.
  delete process.env.REFUND_LEDGER;
});

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
const asJson = (value: unknown) => Task.toJSON(value as Task) as Json;
const artifact = (task: Json, name: string) => (task.artifacts as Json[] | undefined)?.find((candidate) => candidate.name === name);

describe('the refund example over the official client', () => {
  it('asks for the amount, waits for an approval given with keel runs approve, refunds once and keeps the result', async () => {
    const client = await sdkClient(keel.url, 'refunds', token);

    const asked = asJson(await client.sendMessage(textMessage('My blender arrived broken, I want my money back')));
    expect(asked.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    expect(asked.status.message.parts[0].text).toBe(AMOUNT_PROMPT);

    const replied = asJson(
      await client.sendMessage(
        SendMessageRequest.fromJSON({
          message: { messageId: 'amount-reply', role: 'ROLE_USER', taskId: asked.id, contextId: asked.contextId, parts: [{ text: 'it was $250' }] },
          configuration: { returnImmediately: true },
        }),
      ),
    );
    expect(replied.id).toBe(asked.id);
    await waitForRunStatus(keel.context.pool, asked.id, ['waiting_for_approval']);
    expect(asJson(await client.getTask({ id: asked.id } as never)).status.state).toBe('TASK_STATE_WORKING');

    const shown = await keelCli('runs', 'show', asked.id);
    expect(shown.code, shown.stderr).toBe(0);
    expect(shown.stdout).toContain('askApproval');
    expect(shown.stdout).toContain('Refund 250.00');
    expect(shown.stdout).toMatch(/machineState\s+awaitingApproval/);
    expect(shown.stdout).toMatch(new RegExp(`machineVersion\\s+${keel.registry.get('refunds')!.statechart!.hash}`));
    const digest = /turn digest ([0-9a-f]{64})/.exec(shown.stdout)![1]!;
    const approved = await keelCli('runs', 'approve', asked.id, '--turn', digest);
    expect(approved.code, approved.stderr).toBe(0);

    await waitForRunStatus(keel.context.pool, asked.id, ['completed']);
    const done = asJson(await client.getTask({ id: asked.id, historyLength: 10 } as never));
    expect(done.status.state).toBe('TASK_STATE_COMPLETED');
    expect(artifact(done, 'answer')!.parts[0].text).toMatch(/^Refunded 250\.00 \(the blender arrived broken\); refund /);
    expect(artifact(done, 'result')!.parts[0].data).toMatchObject({ status: 'refunded', amount: 250, reason: 'the blender arrived broken' });
    expect(artifact(done, 'receipt')!.parts[0].data).toMatchObject({ amount: 250 });
    const history = (done.history as Json[]).map((message) => `${message.role}: ${message.parts.map((part: Json) => part.text ?? JSON.stringify(part.data)).join('')}`);
    expect(history).toEqual(['ROLE_USER: My blender arrived broken, I want my money back', `ROLE_AGENT: ${AMOUNT_PROMPT}`, 'ROLE_USER: it was $250']);
    const refunds = readFileSync(ledger, 'utf8').split('\n').filter(Boolean);
    expect(refunds).toHaveLength(1);
    expect(JSON.parse(refunds[0]!)).toMatchObject({ amount: 250 });

    // A later turn in the same context is a task of its own; the refunded one keeps its result.
    const later = asJson(await client.sendMessage(textMessage('and the toaster too', { contextId: asked.contextId })));
    expect(later.id).not.toBe(asked.id);
    expect(later.contextId).toBe(asked.contextId);
    expect(later.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
    const kept = asJson(await client.getTask({ id: asked.id } as never));
    expect(kept.status.state).toBe('TASK_STATE_COMPLETED');
    expect(kept.artifacts).toEqual(done.artifacts);
  });
});
