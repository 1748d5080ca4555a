import { describe, it, expect } from 'vitest';
import { createEchoProvider, estimateTokens, lastUserText } from '../../../src/providers/echo-provider.js';
import type { ProviderCallInput, TranscriptMessage } from '../../../src/providers/provider.js';

function input(transcript: TranscriptMessage[], iteration = 0): ProviderCallInput {
  return { runId: 'run-1', iteration, transcript, tools: [], signal: new AbortController().signal };
}

describe('echo provider', () => {
  const provider = createEchoProvider('echo-a');

  it('has its name and type', () => {
    expect(provider.name).toBe('echo-a');
    expect(provider.type).toBe('echo');
  });

  it('echoes the last user message, not an earlier one or a later assistant/tool message', async () => {
    const transcript: TranscriptMessage[] = [
      { role: 'system', content: 'You are helpful.' },
      { role: 'user', content: 'first question' },
      { role: 'assistant', content: 'first answer' },
      { role: 'user', content: 'second question' },
      { role: 'assistant', content: null, toolCalls: [{ id: 'c1', name: 'lookup', arguments: { q: 'x' } }] },
      { role: 'tool', toolCallId: 'c1', name: 'lookup', content: 'tool output' },
    ];
    const outcome = await provider.call(input(transcript));
    expect(outcome).toEqual({
      ok: true,
      reply: {
        text: 'echo: second question',
        toolCalls: [],
        artifacts: [],
        usage: expect.objectContaining({ outputTokens: estimateTokens('echo: second question') }),
      },
    });
  });

  it('estimates usage as ceil(chars / 4) of input and output', async () => {
    const outcome = await provider.call(input([{ role: 'user', content: 'abcde' }]));
    expect(outcome.ok).toBe(true);
    if (!outcome.ok) return;
    expect(outcome.reply.usage).toEqual({ inputTokens: 2, outputTokens: Math.ceil('echo: abcde'.length / 4) });
    expect(estimateTokens('')).toBe(0);
    expect(estimateTokens('abcd')).toBe(1);
    expect(estimateTokens('abcde')).toBe(2);
  });

  it('is deterministic: the same transcript gives the same reply, whatever the iteration', async () => {
    const transcript: TranscriptMessage[] = [{ role: 'user', content: 'Grüße, 世界 🚀' }];
    const a = await provider.call(input(transcript, 0));
    const b = await provider.call(input(transcript, 7));
    expect(a).toEqual(b);
    expect(a.ok && a.reply.text).toBe('echo: Grüße, 世界 🚀');
  });

  it('answers "echo: " when there is no user message', async () => {
    expect(lastUserText([{ role: 'system', content: 's' }])).toBe('');
    const outcome = await provider.call(input([{ role: 'system', content: 's' }]));
    expect(outcome.ok && outcome.reply.text).toBe('echo: ');
  });
});
