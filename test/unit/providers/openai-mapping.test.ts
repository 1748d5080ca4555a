import { describe, it, expect } from 'vitest';
import {
  buildRequestBody,
  chatCompletionsUrl,
  parseCompletion,
  parseRetryAfter,
} from '../../../src/providers/openai-provider.js';

const body = (value: unknown): Buffer => Buffer.from(typeof value === 'string' ? value : JSON.stringify(value));

describe('openai request mapping', () => {
  it('joins the base URL and path with or without a trailing slash', () => {
    expect(chatCompletionsUrl('http://h/v1')).toBe('http://h/v1/chat/completions');
    expect(chatCompletionsUrl('http://h/v1/')).toBe('http://h/v1/chat/completions');
  });

  it('omits tools and tool_choice when there are no tools', () => {
    expect(buildRequestBody('m', { transcript: [{ role: 'user', content: 'hi' }], tools: [] })).toEqual({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
    });
  });

  it('maps an assistant message without tool calls to plain content', () => {
    expect(buildRequestBody('m', { transcript: [{ role: 'assistant', content: 'a', toolCalls: [] }], tools: [] }).messages).toEqual([
      { role: 'assistant', content: 'a' },
    ]);
  });
});

describe('parseRetryAfter', () => {
  it('reads delay seconds', () => {
    expect(parseRetryAfter('7')).toBe(7000);
    expect(parseRetryAfter('0')).toBe(0);
    expect(parseRetryAfter('1.5')).toBe(1500);
  });

  it('reads an HTTP date relative to now, never negative', () => {
    const now = Date.parse('Wed, 21 Oct 2026 07:28:00 GMT');
    expect(parseRetryAfter('Wed, 21 Oct 2026 07:28:30 GMT', now)).toBe(30_000);
    expect(parseRetryAfter('Wed, 21 Oct 2026 07:27:00 GMT', now)).toBe(0);
  });

  it('ignores absent or unparseable values', () => {
    expect(parseRetryAfter(undefined)).toBeUndefined();
    expect(parseRetryAfter('')).toBeUndefined();
    expect(parseRetryAfter('soon')).toBeUndefined();
    expect(parseRetryAfter('-3')).toBeUndefined();
  });
});

describe('parseCompletion', () => {
  it('parses text, tool calls and usage from the first choice', () => {
    const result = parseCompletion(
      body({
        choices: [
          {
            message: {
              content: 'hi',
              tool_calls: [{ id: 'x', type: 'function', function: { name: 'f', arguments: '{"a":1}' } }],
            },
          },
          { message: { content: 'second choice is ignored' } },
        ],
        usage: { prompt_tokens: 5, completion_tokens: 2 },
      }),
      200,
      0,
    );
    expect(result).toEqual({
      ok: true,
      reply: { text: 'hi', toolCalls: [{ id: 'x', name: 'f', arguments: { a: 1 } }], artifacts: [], usage: { inputTokens: 5, outputTokens: 2 } },
    });
  });

  it('treats empty arguments as {}, generates missing ids and defaults usage to zero', () => {
    const result = parseCompletion(
      body({ choices: [{ message: { content: null, tool_calls: [{ type: 'function', function: { name: 'f', arguments: '' } }] } }] }),
      200,
      3,
    );
    expect(result).toEqual({
      ok: true,
      reply: { text: null, toolCalls: [{ id: 'call_3_0', name: 'f', arguments: {} }], artifacts: [], usage: { inputTokens: 0, outputTokens: 0 } },
    });
  });

  it('joins array content parts', () => {
    const result = parseCompletion(body({ choices: [{ message: { content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] } }] }), 200, 0);
    expect(result.ok && result.reply.text).toBe('ab');
  });

  it.each([
    ['not JSON', 'garbage{'],
    ['no choices', { choices: [] }],
    ['choices missing', { id: 'x' }],
    ['no message', { choices: [{}] }],
    ['a non-object body', '[1,2]'],
  ])('classifies %s as unknown', (_label, value) => {
    const result = parseCompletion(body(value), 200, 0);
    expect(result).toMatchObject({ ok: false, failure: { class: 'unknown', status: 200 } });
  });

  it.each([['{not json'], ['[1,2]'], ['"a string"']])('classifies tool call arguments %s as malformed', (args) => {
    const result = parseCompletion(
      body({ choices: [{ message: { content: null, tool_calls: [{ id: 'x', type: 'function', function: { name: 'f', arguments: args } }] } }] }),
      200,
      0,
    );
    expect(result).toEqual({ ok: false, failure: { class: 'unknown', message: 'malformed tool call arguments', status: 200 } });
  });
});
