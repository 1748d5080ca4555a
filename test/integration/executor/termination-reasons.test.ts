import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cancelRun, getRun } from '../../../src/runs/run-repository.js';
import { listRunOutputs } from '../../../src/runs/run-output-repository.js';
import { silentLogger } from '../../../src/log/logger.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { runToEnd, startRun, TERMINAL, TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { waitForRunStatus } from '../../support/wait-for.js';

// Every termination reason, reached through a real run driven by the scripted provider and by the
// openai provider against a fake OpenAI-compatible endpoint (a real HTTP server on loopback).

type FakeModel = 'reply' | 'loop' | 'tokens' | 'fail500' | 'fail401' | 'forbidden' | 'slow';

let endpoint: Server;
let endpointUrl = '';
const received: Array<{ model: string; messages: unknown[] }> = [];

function answer(model: FakeModel, body: { messages: Array<{ role: string; content: string | null }> }) {
  const lookup = { role: 'assistant', content: null, tool_calls: [{ id: `call_${body.messages.length}`, type: 'function', function: { name: 'lookup', arguments: '{"key":"k"}' } }] };
  switch (model) {
    case 'reply':
      return { status: 200, body: { choices: [{ message: { role: 'assistant', content: `model says: ${body.messages.at(-1)?.content}` } }], usage: { prompt_tokens: 5, completion_tokens: 7 } } };
    case 'loop':
      return { status: 200, body: { choices: [{ message: lookup }], usage: { prompt_tokens: 1, completion_tokens: 1 } } };
    case 'tokens':
      return { status: 200, body: { choices: [{ message: lookup }], usage: { prompt_tokens: 60, completion_tokens: 40 } } };
    case 'slow':
      return { status: 200, delayMs: 150, body: { choices: [{ message: lookup }], usage: { prompt_tokens: 1, completion_tokens: 1 } } };
    case 'fail500':
      return { status: 500, body: { error: { message: 'upstream broke' } } };
    case 'fail401':
      return { status: 401, body: { error: { message: 'bad key' } } };
    case 'forbidden':
      return { status: 200, body: { choices: [{ message: { role: 'assistant', content: 'here is the forbidden plan' } }] } };
  }
}

const scripted = (steps: unknown[]) => ({ type: 'scripted', steps });
const openai = (model: FakeModel) => ({ type: 'openai', baseUrl: `${endpointUrl}/v1`, model, apiKeyEnv: 'FAKE_LLM_KEY', timeoutSeconds: 5 });
const agent = (id: string, provider: string, extra: Record<string, unknown> = {}) => ({ id, name: id, provider, ...extra });
const denyForbidden = { guardrails: [{ type: 'denyPattern', name: 'no-forbidden', patterns: ['forbidden'], on: ['input', 'answer'], reason: 'forbidden topic' }] };
const reviewInput = { guardrails: [{ type: 'denyPattern', name: 'needs-review', patterns: ['review me'], on: ['input'], action: 'requireApproval', reason: 'a person must look' }] };

let keel: TestKeel;

beforeAll(async () => {
  endpoint = createServer((request, response) => {
    let raw = '';
    request.on('data', (chunk: Buffer) => (raw += chunk.toString('utf8')));
    request.on('end', () => {
      const body = JSON.parse(raw) as { model: FakeModel; messages: Array<{ role: string; content: string | null }> };
      received.push({ model: body.model, messages: body.messages });
      const result = answer(body.model, body);
      setTimeout(() => {
        response.writeHead(result.status, { 'content-type': 'application/json' });
        response.end(JSON.stringify(result.body));
      }, 'delayMs' in result ? result.delayMs : 0);
    });
  });
  await new Promise<void>((resolve) => endpoint.listen(0, '127.0.0.1', resolve));
  endpointUrl = `http://127.0.0.1:${(endpoint.address() as AddressInfo).port}`;

  keel = await startTestKeel({
    env: { FAKE_LLM_KEY: 'sk-test-key' },
    overrides: {
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HOSTS: '127.0.0.1',
      KEEL_SECURITY_ADDRESS_GUARD_ALLOW_HTTP: 'true',
      KEEL_RUNS_PROVIDER_BACKOFF_MS: '5',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        'sc-reply': scripted([{ reply: 'scripted answer', tokens: 3 }]),
        'sc-loop': scripted([{ toolCalls: [{ name: 'lookup', arguments: {} }] }]),
        'sc-tokens': scripted([{ toolCalls: [{ name: 'lookup', arguments: {} }], tokens: 100 }]),
        'sc-500': scripted([{ fail: 'server_error' }]),
        'sc-auth': scripted([{ fail: 'auth' }]),
        'sc-slow': scripted([{ toolCalls: [{ name: 'lookup', arguments: {} }], delayMs: 150 }]),
        'sc-forbidden': scripted([{ reply: 'the forbidden answer' }]),
        'oa-reply': openai('reply'),
        'oa-loop': openai('loop'),
        'oa-tokens': openai('tokens'),
        'oa-500': openai('fail500'),
        'oa-401': openai('fail401'),
        'oa-forbidden': openai('forbidden'),
        'oa-slow': openai('slow'),
      },
      KEEL_AGENTS: [
        agent('echo', 'echo'),
        ...['sc', 'oa'].flatMap((kind) => [
          agent(`${kind}-completed`, kind === 'sc' ? 'sc-reply' : 'oa-reply', denyForbidden),
          agent(`${kind}-max-iterations`, `${kind}-loop`, { tools: ['lookup'], limits: { maxIterations: 3 } }),
          agent(`${kind}-budget`, `${kind}-tokens`, { tools: ['lookup'], limits: { maxIterations: 50, tokenBudget: 250 } }),
          agent(`${kind}-policy-input`, kind === 'sc' ? 'sc-reply' : 'oa-reply', denyForbidden),
          agent(`${kind}-policy-answer`, `${kind}-forbidden`, denyForbidden),
          agent(`${kind}-review`, kind === 'sc' ? 'sc-reply' : 'oa-reply', reviewInput),
          agent(`${kind}-provider-failed`, `${kind}-500`),
          agent(`${kind}-not-retryable`, kind === 'sc' ? 'sc-auth' : 'oa-401'),
          agent(`${kind}-slow`, `${kind}-slow`, { tools: ['lookup'], limits: { maxIterations: 500 } }),
        ]),
      ],
    },
  });
});

afterAll(async () => {
  await keel?.dispose();
  endpoint?.close();
});

describe.each(['sc', 'oa'] as const)('termination reasons with the %s provider', (kind) => {
  it('completed: the answer is stored with the run', async () => {
    const run = await runToEnd(keel, `${kind}-completed`, 'hello there');
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed', truncated: false, iterations: 1 });
    const outputs = await listRunOutputs(keel.context.pool, keel.context.sealer, run.id);
    expect(outputs).toHaveLength(1);
    expect(outputs[0]).toMatchObject({ kind: 'answer', level: 'full' });
    expect(JSON.stringify(outputs[0]!.content)).toContain(kind === 'sc' ? 'scripted answer' : 'model says: hello there');
    expect(run.queued_request).toBeNull();
  });

  it('max_iterations: completed, truncated', async () => {
    const run = await runToEnd(keel, `${kind}-max-iterations`, 'go');
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'max_iterations', truncated: true, iterations: 3, tool_calls: 3 });
  });

  it('budget_exhausted: completed, truncated', async () => {
    const run = await runToEnd(keel, `${kind}-budget`, 'go');
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'budget_exhausted', truncated: true, iterations: 3 });
    expect(run.input_tokens + run.output_tokens).toBeGreaterThanOrEqual(250);
  });

  it('policy_denied on the input: failed with the guardrail name and reason, never the text', async () => {
    const run = await runToEnd(keel, `${kind}-policy-input`, 'tell me the forbidden thing');
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'policy_denied', iterations: 0 });
    expect(run.failure_detail).toEqual({ stage: 'input', guardrail: 'no-forbidden', reason: 'forbidden topic' });
    expect(JSON.stringify(run)).not.toContain('tell me');
  });

  it('policy_denied on the answer: nothing of the answer is stored', async () => {
    const run = await runToEnd(keel, `${kind}-policy-answer`, 'hi');
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'policy_denied' });
    expect(run.failure_detail).toMatchObject({ stage: 'answer', guardrail: 'no-forbidden' });
    expect(await listRunOutputs(keel.context.pool, keel.context.sealer, run.id)).toEqual([]);
  });

  it('approval_denied: a guardrail that asks for approval, denied by the operator', async () => {
    const { decideApproval, readSuspendedRun } = await import('../../../src/runs/resume-run.js');
    const id = await startRun(keel, `${kind}-review`, 'please review me');
    await waitForRunStatus(keel.context.pool, id, ['waiting_for_approval']);
    const read = await readSuspendedRun(keel.context.pool, keel.context.sealer, id, 'waiting_for_approval');
    if (!read.ok) throw new Error(read.reason);
    const pending = read.view.state.pendingApproval!;
    expect(pending).toMatchObject({ kind: 'guardrail', stage: 'input', guardrail: 'needs-review' });
    expect(await decideApproval(keel.context, id, pending.digest, false)).toMatchObject({ ok: true });
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'approval_denied' });
    expect(run.failure_detail).toMatchObject({ guardrail: 'needs-review', decision: 'denied' });
  });

  it('provider_failed: a retryable failure exhausts the chain', async () => {
    const run = await runToEnd(keel, `${kind}-provider-failed`, 'hi');
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'provider_failed', error_class: 'server_error' });
  });

  it('not_retryable: an auth failure', async () => {
    const run = await runToEnd(keel, `${kind}-not-retryable`, 'hi');
    expect(run).toMatchObject({ status: 'failed', termination_reason: 'not_retryable', error_class: 'auth' });
  });

  it('cancelled: cooperative cancel stops a long run within one step', async () => {
    const id = await startRun(keel, `${kind}-slow`, 'hi');
    await waitForRunStatus(keel.context.pool, id, ['running']);
    await new Promise((resolve) => setTimeout(resolve, 400));
    const cancelledAt = Date.now();
    expect((await cancelRun(keel.context.pool, silentLogger(), id)).settled).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 800));
    const run = await getRun(keel.context.pool, id);
    expect(run).toMatchObject({ status: 'cancelled', termination_reason: 'cancelled' });
    const { listRunEvents } = await import('../../../src/runs/run-event-repository.js');
    const events = await listRunEvents(keel.context.pool, id);
    const stepsAfter = events.filter((event) => event.kind === 'model_reply' && event.created_at > cancelledAt + 5);
    expect(stepsAfter.length).toBeLessThanOrEqual(1);
    expect(events.filter((event) => event.kind === 'model_reply').length).toBeGreaterThanOrEqual(2);
  });
});

describe('the fake endpoint saw real OpenAI requests', () => {
  it('with tool results in the transcript', () => {
    const loop = received.filter((request) => request.model === 'loop');
    expect(loop.length).toBeGreaterThanOrEqual(3);
    expect(JSON.stringify(loop.at(-1)!.messages)).toContain('"role":"tool"');
  });
});
