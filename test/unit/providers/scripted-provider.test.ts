import { describe, it, expect } from 'vitest';
import type { ProviderErrorClass, ScriptedStep } from '../../../src/config/config-schema.js';
import { createScriptedProvider, selectStep } from '../../../src/providers/scripted-provider.js';
import type { ProviderCallInput, ProviderOutcome, TranscriptMessage } from '../../../src/providers/provider.js';

const transcript: TranscriptMessage[] = [{ role: 'user', content: 'hello there' }];

function input(iteration: number, signal: AbortSignal = new AbortController().signal): ProviderCallInput {
  return { runId: 'run-1', iteration, transcript, tools: [], signal };
}

function reply(outcome: ProviderOutcome) {
  if (!outcome.ok) throw new Error(`expected a reply, got ${outcome.failure.class}: ${outcome.failure.message}`);
  return outcome.reply;
}

describe('step selection', () => {
  const steps: ScriptedStep[] = [{ reply: 'a' }, { reply: 'b' }, { reply: 'c' }];

  it('picks steps[iteration] and repeats the last step past the end', () => {
    expect(selectStep(steps, 0)?.reply).toBe('a');
    expect(selectStep(steps, 1)?.reply).toBe('b');
    expect(selectStep(steps, 2)?.reply).toBe('c');
    expect(selectStep(steps, 3)?.reply).toBe('c');
    expect(selectStep(steps, 999)?.reply).toBe('c');
    expect(selectStep([], 0)).toBeUndefined();
  });

  it('a trailing tool-call step repeats with ids for the current iteration', async () => {
    const provider = createScriptedProvider('s', [{ reply: 'first' }, { toolCalls: [{ name: 'loop', arguments: { n: 1 } }] }]);
    expect(reply(await provider.call(input(0)))).toMatchObject({ text: 'first', toolCalls: [] });
    for (const iteration of [1, 2, 5, 19]) {
      const r = reply(await provider.call(input(iteration)));
      expect(r.text).toBeNull();
      expect(r.toolCalls).toEqual([{ id: `call_${iteration}_0`, name: 'loop', arguments: { n: 1 } }]);
    }
  });
});

describe('scripted provider', () => {
  it('has its name and type', () => {
    const provider = createScriptedProvider('scripty', []);
    expect(provider.name).toBe('scripty');
    expect(provider.type).toBe('scripted');
  });

  it('behaves like echo with an empty steps list', async () => {
    const provider = createScriptedProvider('s', []);
    const r = reply(await provider.call(input(3)));
    expect(r.text).toBe('echo: hello there');
    expect(r.toolCalls).toEqual([]);
    expect(r.artifacts).toEqual([]);
  });

  it('returns reply text with usage from tokens', async () => {
    const provider = createScriptedProvider('s', [{ reply: 'the answer', tokens: 42 }]);
    expect(reply(await provider.call(input(0)))).toEqual({
      text: 'the answer',
      toolCalls: [],
      artifacts: [],
      usage: { inputTokens: 0, outputTokens: 42 },
    });
  });

  it('defaults usage to zero and text to null', async () => {
    const provider = createScriptedProvider('s', [{}]);
    expect(reply(await provider.call(input(0)))).toEqual({
      text: null,
      toolCalls: [],
      artifacts: [],
      usage: { inputTokens: 0, outputTokens: 0 },
    });
  });

  it('returns tool calls with ids call_<iteration>_<index>, together with reply text when both are given', async () => {
    const provider = createScriptedProvider('s', [
      { reply: 'x' },
      {
        reply: 'thinking out loud',
        toolCalls: [
          { name: 'http_get', arguments: { url: 'https://example.com' } },
          { name: 'noop', arguments: {} },
        ],
      },
    ]);
    const r = reply(await provider.call(input(1)));
    expect(r.text).toBe('thinking out loud');
    expect(r.toolCalls).toEqual([
      { id: 'call_1_0', name: 'http_get', arguments: { url: 'https://example.com' } },
      { id: 'call_1_1', name: 'noop', arguments: {} },
    ]);
  });

  it('does not let a consumer mutate the script through returned arguments', async () => {
    const provider = createScriptedProvider('s', [{ toolCalls: [{ name: 't', arguments: { nested: { v: 1 } } }] }]);
    const first = reply(await provider.call(input(0)));
    (first.toolCalls[0]?.arguments.nested as { v: number }).v = 99;
    const second = reply(await provider.call(input(1)));
    expect(second.toolCalls[0]?.arguments).toEqual({ nested: { v: 1 } });
  });

  it('emits an artifact with one text part and a default id artifact-<iteration>', async () => {
    const provider = createScriptedProvider('s', [{ artifact: { text: 'chunk' } }]);
    expect(reply(await provider.call(input(4))).artifacts).toEqual([{ artifactId: 'artifact-4', parts: [{ text: 'chunk' }] }]);
  });

  it('emits artifact chunks with id, name, append and lastChunk as declared', async () => {
    const provider = createScriptedProvider('s', [
      { artifact: { artifactId: 'report', name: 'Report', text: 'part 1', append: false, lastChunk: false } },
      { artifact: { artifactId: 'report', text: 'part 2', append: true, lastChunk: true }, reply: 'done', tokens: 3 },
    ]);
    expect(reply(await provider.call(input(0))).artifacts).toEqual([
      { artifactId: 'report', name: 'Report', parts: [{ text: 'part 1' }], append: false, lastChunk: false },
    ]);
    const r = reply(await provider.call(input(1)));
    expect(r.artifacts).toEqual([{ artifactId: 'report', parts: [{ text: 'part 2' }], append: true, lastChunk: true }]);
    expect(r.text).toBe('done');
    expect(r.usage).toEqual({ inputTokens: 0, outputTokens: 3 });
  });

  it('waits delayMs before replying', async () => {
    const provider = createScriptedProvider('s', [{ delayMs: 120, reply: 'late' }]);
    const started = performance.now();
    const r = reply(await provider.call(input(0)));
    expect(performance.now() - started).toBeGreaterThanOrEqual(100);
    expect(r.text).toBe('late');
  });

  it('an abort during the delay ends the wait immediately with class unknown, message aborted', async () => {
    const provider = createScriptedProvider('s', [{ delayMs: 600_000, reply: 'never' }]);
    const controller = new AbortController();
    const started = performance.now();
    const pending = provider.call(input(0, controller.signal));
    setTimeout(() => controller.abort(), 30);
    const outcome = await pending;
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(outcome).toEqual({ ok: false, failure: { class: 'unknown', message: 'aborted' } });
  });

  it('an already-aborted signal returns aborted without waiting', async () => {
    const provider = createScriptedProvider('s', [{ delayMs: 600_000, reply: 'never' }]);
    const controller = new AbortController();
    controller.abort();
    const started = performance.now();
    const outcome = await provider.call(input(0, controller.signal));
    expect(performance.now() - started).toBeLessThan(500);
    expect(outcome).toEqual({ ok: false, failure: { class: 'unknown', message: 'aborted' } });
  });

  const classes: ProviderErrorClass[] = [
    'connection',
    'rate_limit',
    'auth',
    'configuration',
    'client_error',
    'server_error',
    'unknown',
  ];
  it.each(classes)('fails with class %s and message "scripted failure: <class>"', async (errorClass) => {
    const provider = createScriptedProvider('s', [{ fail: errorClass, reply: 'ignored' }]);
    const outcome = await provider.call(input(0));
    const expected = errorClass === 'rate_limit'
      ? { class: errorClass, message: `scripted failure: ${errorClass}`, retryAfterMs: 0 }
      : { class: errorClass, message: `scripted failure: ${errorClass}` };
    expect(outcome).toEqual({ ok: false, failure: expected });
  });

  it('fails after the delay, and a failing first step can be followed by a reply', async () => {
    const provider = createScriptedProvider('s', [{ fail: 'server_error', delayMs: 50 }, { reply: 'recovered' }]);
    const started = performance.now();
    const outcome = await provider.call(input(0));
    expect(performance.now() - started).toBeGreaterThanOrEqual(40);
    expect(outcome.ok).toBe(false);
    expect(reply(await provider.call(input(1))).text).toBe('recovered');
  });
});
