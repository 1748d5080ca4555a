import { describe, it, expect } from 'vitest';
import {
  SUMMARY_LIMITS,
  base64ByteLength,
  summarizeMessage,
  summarizePart,
  summarizeParts,
  summarizeToolCall,
  summarizeToolCalls,
  summarizeValue,
  summaryMediaType,
  summaryName,
  type ValueSummary,
} from '../../../src/privacy/summarize.js';

describe('summarizeValue: kinds, counts, lengths', () => {
  it.each<[string, unknown, ValueSummary]>([
    ['a string', 'hello', { kind: 'text', length: 5 }],
    ['an empty string', '', { kind: 'text', length: 0 }],
    ['a number', 42.5, { kind: 'number' }],
    ['NaN', Number.NaN, { kind: 'number' }],
    ['a bigint', 10n ** 30n, { kind: 'number' }],
    ['true', true, { kind: 'boolean' }],
    ['false', false, { kind: 'boolean' }],
    ['null', null, { kind: 'null' }],
    ['undefined', undefined, { kind: 'undefined' }],
    ['a function', () => 'secret', { kind: 'other' }],
    ['a symbol', Symbol('secret'), { kind: 'other' }],
    ['an empty array', [], { kind: 'array', count: 0 }],
    ['an empty object', {}, { kind: 'object', count: 0, keys: [] }],
    ['a Uint8Array', new Uint8Array(7), { kind: 'binary', bytes: 7 }],
    ['a Buffer', Buffer.from('secret bytes'), { kind: 'binary', bytes: 12 }],
    ['an ArrayBuffer', new ArrayBuffer(9), { kind: 'binary', bytes: 9 }],
    ['a DataView', new DataView(new ArrayBuffer(4)), { kind: 'binary', bytes: 4 }],
    ['a Date (as JSON text)', new Date(0), { kind: 'text', length: 24 }],
  ])('%s', (_name, input, expected) => {
    expect(summarizeValue(input)).toEqual(expected);
  });

  it('describes arrays and objects with names, counts and nested kinds', () => {
    const input = { name: 'Alice', age: 31, tags: ['a', 'bb', 7], address: { city: 'Paris', zip: null } };
    expect(summarizeValue(input)).toEqual({
      kind: 'object',
      count: 4,
      keys: ['name', 'age', 'tags', 'address'],
      values: [
        { kind: 'text', length: 5 },
        { kind: 'number' },
        { kind: 'array', count: 3, items: [{ kind: 'text', length: 1 }, { kind: 'text', length: 2 }, { kind: 'number' }] },
        { kind: 'object', count: 2, keys: ['city', 'zip'], values: [{ kind: 'text', length: 5 }, { kind: 'null' }] },
      ],
    });
  });

  it('uses toJSON like JSON.stringify', () => {
    expect(summarizeValue({ toJSON: () => ['x', 'y'] })).toEqual({
      kind: 'array',
      count: 2,
      items: [
        { kind: 'text', length: 1 },
        { kind: 'text', length: 1 },
      ],
    });
  });

  it(`describes at most ${SUMMARY_LIMITS.maxItems} items but counts all`, () => {
    const summary = summarizeValue(Array.from({ length: 100 }, (_, i) => `item ${i}`));
    expect(summary).toMatchObject({ kind: 'array', count: 100 });
    expect((summary as { items: unknown[] }).items).toHaveLength(SUMMARY_LIMITS.maxItems);
  });

  it(`names at most ${SUMMARY_LIMITS.maxKeys} keys but counts all`, () => {
    const input = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`k${i}`, i]));
    const summary = summarizeValue(input) as { count: number; keys: string[]; values: unknown[] };
    expect(summary.count).toBe(100);
    expect(summary.keys).toHaveLength(SUMMARY_LIMITS.maxKeys);
    expect(summary.keys[0]).toBe('k0');
    expect(summary.values).toHaveLength(SUMMARY_LIMITS.maxKeys);
  });

  it(`stops describing children below depth ${SUMMARY_LIMITS.maxDepth}`, () => {
    let input: unknown = 'leaf';
    for (let i = 0; i < 10; i += 1) input = { child: input };
    let summary = summarizeValue(input) as { values?: ValueSummary[]; keys: string[] };
    let depth = 0;
    while (summary.values !== undefined) {
      summary = summary.values[0] as typeof summary;
      depth += 1;
    }
    expect(depth).toBe(SUMMARY_LIMITS.maxDepth);
    // The deepest described object still gives its kind, count and key names.
    expect(summary).toEqual({ kind: 'object', count: 1, keys: ['child'] });
    const arrays = summarizeValue([[[[[['deep']]]]]]);
    expect(JSON.stringify(arrays)).not.toContain('text');
  });

  it('terminates on cyclic values', () => {
    const cyclic: Record<string, unknown> = { a: 'x' };
    cyclic.self = cyclic;
    const list: unknown[] = [];
    list.push(list);
    expect(summarizeValue(cyclic)).toMatchObject({ kind: 'object', count: 2, keys: ['a', 'self'] });
    expect(summarizeValue(list)).toMatchObject({ kind: 'array', count: 1 });
  });

  it('keeps a __proto__ key as a name and touches no prototype', () => {
    const input = JSON.parse('{"__proto__": {"x": "y"}}') as unknown;
    const summary = summarizeValue(input) as { keys: string[]; values: ValueSummary[] };
    expect(summary.keys).toEqual(['__proto__']);
    expect(summary.values[0]).toEqual({ kind: 'object', count: 1, keys: ['x'], values: [{ kind: 'text', length: 1 }] });
    expect(Object.getPrototypeOf(summary)).toBe(Object.prototype);
  });

  it('masks secret-shaped and overlong names but keeps ordinary ones, unicode included', () => {
    const long = 'this key is really a whole sentence that somebody used as a property name';
    const summary = summarizeValue({ 'alice@example.com': 1, [long]: 2, 'Prénom': 3, user_id: 4 }) as { keys: string[] };
    expect(summary.keys).toEqual(['***', '***', 'Prénom', 'user_id']);
  });
});

describe('summaryName', () => {
  it.each([
    ['get_weather', 'get_weather'],
    ['a'.repeat(SUMMARY_LIMITS.maxNameLength), 'a'.repeat(SUMMARY_LIMITS.maxNameLength)],
    ['a'.repeat(SUMMARY_LIMITS.maxNameLength + 1), '***'],
    ['bob@example.com', '***'],
    ['', ''],
  ])('%j -> %j', (name, expected) => {
    expect(summaryName(name)).toBe(expected);
  });
});

describe('summaryMediaType', () => {
  it.each<[unknown, string | undefined]>([
    ['text/plain', 'text/plain'],
    ['Text/Plain; charset=UTF-8', 'text/plain'],
    ['application/vnd.api+json', 'application/vnd.api+json'],
    ['image/svg+xml ; name="secret plans.svg"', 'image/svg+xml'],
    ['  application/json  ', 'application/json'],
    ['not a media type', undefined],
    ['text/', undefined],
    ['/plain', undefined],
    ['text/plain/extra', undefined],
    ['text/pl ain', undefined],
    ['text/plain\nsecret', undefined],
    ['text/plain; a=b\nsecret', undefined],
    [`text/${'x'.repeat(200)}`, undefined],
    [`text/plain;${'x'.repeat(2000)}`, undefined],
    ['', undefined],
    [42, undefined],
    [null, undefined],
    [undefined, undefined],
  ])('%j -> %j', (input, expected) => {
    expect(summaryMediaType(input)).toBe(expected);
  });
});

describe('base64ByteLength', () => {
  it.each<[string, number]>([
    ['', 0],
    ['QQ==', 1],
    ['QUI=', 2],
    ['QUJD', 3],
    ['QQ', 1],
    ['aGVsbG8gd29ybGQ=', 11],
    ['aGVs\nbG8g\r\nd29y bGQ=', 11],
    ['-_-_', 3],
  ])('%j decodes to %d bytes', (input, expected) => {
    expect(base64ByteLength(input)).toBe(expected);
  });

  it('agrees with Buffer on random data', () => {
    for (let n = 0; n < 200; n += 1) {
      const bytes = Buffer.alloc(n, n % 251);
      expect(base64ByteLength(bytes.toString('base64'))).toBe(n);
      expect(base64ByteLength(bytes.toString('base64url'))).toBe(n);
    }
  });
});

describe('summarizePart (A2A 1.0 parts)', () => {
  it.each<[string, unknown, unknown]>([
    ['text', { text: 'hello there' }, { kind: 'text', length: 11 }],
    ['text with media type', { text: '# T', mediaType: 'text/markdown' }, { kind: 'text', length: 3, mediaType: 'text/markdown' }],
    [
      'raw base64 with file name',
      { raw: Buffer.from('secret file').toString('base64'), mediaType: 'application/pdf', filename: 'layoffs-q3.pdf' },
      { kind: 'raw', bytes: 11, mediaType: 'application/pdf' },
    ],
    ['raw bytes', { raw: new Uint8Array(5) }, { kind: 'raw', bytes: 5 }],
    ['raw of an odd type', { raw: 12 }, { kind: 'raw', bytes: 0 }],
    [
      'url',
      { url: 'https://files.example/secret-plan.pdf?sig=abc', mediaType: 'application/pdf', filename: 'plan.pdf' },
      { kind: 'url', mediaType: 'application/pdf' },
    ],
    [
      'data',
      { data: { city: 'Paris', n: 1 }, mediaType: 'application/json' },
      {
        kind: 'data',
        data: { kind: 'object', count: 2, keys: ['city', 'n'], values: [{ kind: 'text', length: 5 }, { kind: 'number' }] },
        mediaType: 'application/json',
      },
    ],
    ['data null', { data: null }, { kind: 'data', data: { kind: 'null' } }],
    ['an invalid media type is dropped', { text: 'x', mediaType: 'my secret' }, { kind: 'text', length: 1 }],
    ['part metadata is dropped', { text: 'x', metadata: { note: 'secret' } }, { kind: 'text', length: 1 }],
    ['an empty object', {}, { kind: 'unknown' }],
    ['an unknown shape', { kind: 'file', file: { name: 'x' } }, { kind: 'unknown' }],
    ['a string', 'just text', { kind: 'unknown' }],
    ['null', null, { kind: 'unknown' }],
    ['an array', ['text'], { kind: 'unknown' }],
  ])('%s', (_name, input, expected) => {
    expect(summarizePart(input)).toEqual(expected);
  });

  it(`summarizeParts describes at most ${SUMMARY_LIMITS.maxParts} parts`, () => {
    const parts = Array.from({ length: 100 }, (_, i) => ({ text: `part ${i}` }));
    expect(summarizeParts(parts)).toHaveLength(SUMMARY_LIMITS.maxParts);
    expect(summarizeParts([{ text: 'a' }, { url: 'u' }])).toEqual([{ kind: 'text', length: 1 }, { kind: 'url' }]);
  });
});

describe('summarizeToolCall', () => {
  it.each<[string, unknown, unknown]>([
    ['arguments as JSON text', { name: 'get_weather', arguments: '{"city":"Paris"}' }, { kind: 'tool_call', name: 'get_weather', argumentsLength: 16 }],
    ['arguments as an object', { id: 'call_1', name: 'http_get', arguments: { url: 'https://x' } }, { kind: 'tool_call', name: 'http_get', argumentsLength: 19 }],
    ['the OpenAI shape', { id: 'c', type: 'function', function: { name: 'lookup', arguments: '{}' } }, { kind: 'tool_call', name: 'lookup', argumentsLength: 2 }],
    ['args alias', { name: 'remote_agent', args: 'abc' }, { kind: 'tool_call', name: 'remote_agent', argumentsLength: 3 }],
    ['no arguments', { name: 'ping' }, { kind: 'tool_call', name: 'ping', argumentsLength: 0 }],
    ['null arguments', { name: 'ping', arguments: null }, { kind: 'tool_call', name: 'ping', argumentsLength: 0 }],
    ['no name', { arguments: 'x' }, { kind: 'tool_call', name: '***', argumentsLength: 1 }],
    ['a non-string name', { name: 42, arguments: 'x' }, { kind: 'tool_call', name: '***', argumentsLength: 1 }],
    ['an overlong name', { name: 'n'.repeat(65) }, { kind: 'tool_call', name: '***', argumentsLength: 0 }],
    ['not an object', 'get_weather', { kind: 'tool_call', name: '***', argumentsLength: 0 }],
  ])('%s', (_name, input, expected) => {
    expect(summarizeToolCall(input)).toEqual(expected);
  });

  it('survives arguments that JSON cannot serialize', () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(summarizeToolCall({ name: 'x', arguments: cyclic })).toEqual({ kind: 'tool_call', name: 'x', argumentsLength: 0 });
    expect(summarizeToolCall({ name: 'x', arguments: { n: 1n } })).toEqual({ kind: 'tool_call', name: 'x', argumentsLength: 0 });
  });

  it('summarizeToolCalls maps each call', () => {
    expect(summarizeToolCalls([{ name: 'a', arguments: '' }, { function: { name: 'b', arguments: 'xy' } }])).toEqual([
      { kind: 'tool_call', name: 'a', argumentsLength: 0 },
      { kind: 'tool_call', name: 'b', argumentsLength: 2 },
    ]);
  });
});

describe('summarizeMessage', () => {
  it('describes an A2A message: role, part count and parts; ids and metadata are dropped', () => {
    const message = {
      messageId: 'msg-123',
      contextId: 'ctx-9',
      taskId: 'task-1',
      role: 'ROLE_USER',
      parts: [{ text: 'What is the weather in Paris?' }, { raw: 'QUJD', mediaType: 'image/png', filename: 'me.png' }],
      metadata: { secret: 'x' },
      extensions: ['https://ext.example'],
    };
    expect(summarizeMessage(message)).toEqual({
      kind: 'message',
      role: 'ROLE_USER',
      partCount: 2,
      parts: [
        { kind: 'text', length: 29 },
        { kind: 'raw', bytes: 3, mediaType: 'image/png' },
      ],
    });
  });

  it('describes a chat message with text content and tool calls', () => {
    const message = {
      role: 'assistant',
      content: 'Let me check.',
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
    };
    expect(summarizeMessage(message)).toEqual({
      kind: 'message',
      role: 'assistant',
      partCount: 1,
      parts: [{ kind: 'text', length: 13 }],
      toolCalls: [{ kind: 'tool_call', name: 'get_weather', argumentsLength: 16 }],
    });
  });

  it('accepts content as an array of parts and toolCalls in camel case', () => {
    expect(summarizeMessage({ role: 'ROLE_AGENT', content: [{ text: 'ab' }], toolCalls: [{ name: 't', arguments: 'x' }] })).toEqual({
      kind: 'message',
      role: 'ROLE_AGENT',
      partCount: 1,
      parts: [{ kind: 'text', length: 2 }],
      toolCalls: [{ kind: 'tool_call', name: 't', argumentsLength: 1 }],
    });
  });

  it.each(['ROLE_USER', 'ROLE_AGENT', 'ROLE_UNSPECIFIED', 'user', 'agent', 'assistant', 'system', 'developer', 'tool'])(
    'keeps the known role %s',
    (role) => {
      expect(summarizeMessage({ role, parts: [] }).role).toBe(role);
    },
  );

  it.each(['Alice', 'USER', 'ROLE_ADMIN', '', 3, null])('drops the unknown role %j', (role) => {
    expect(summarizeMessage({ role, parts: [] })).not.toHaveProperty('role');
  });

  it.each([null, undefined, 'hello', 42, ['a']])('describes a non-message %j as empty', (input) => {
    expect(summarizeMessage(input)).toEqual({ kind: 'message', partCount: 0, parts: [] });
  });

  it('counts all parts but describes at most maxParts', () => {
    const summary = summarizeMessage({ role: 'user', parts: Array.from({ length: 50 }, () => ({ text: 'x' })) });
    expect(summary.partCount).toBe(50);
    expect(summary.parts).toHaveLength(SUMMARY_LIMITS.maxParts);
  });
});

// ---------------------------------------------------------------------------------------------------
// No content survives: random inputs, every content string carries a canary character.

/** Deterministic PRNG (mulberry32) so a failure reproduces. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// '§' never occurs in a summary's own vocabulary, nor in names; if it shows up, content leaked.
const CANARY = '§';
const CONTENT_CHARS = [
  ...'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789',
  ...' .,:;!?-_/@#%&*()[]{}<>="\'\\\n\t+~^|`$',
  'é',
  'ü',
  'ñ',
  '日',
  '本',
  '🚀',
  '\u0000',
  '\u2028',
];
const NAME_CHARS = [...'abcdefghijklmnopqrstuvwxyz_0123456789'];
const VALID_MEDIA_TYPES = ['text/plain', 'application/json', 'image/png', 'application/pdf'];
const ROLES = ['ROLE_USER', 'ROLE_AGENT', 'user', 'assistant'];

class Fuzzer {
  readonly contents: string[] = [];
  readonly numbers: number[] = [];
  private readonly random: () => number;

  constructor(seed: number) {
    this.random = prng(seed);
  }

  int(max: number): number {
    return Math.floor(this.random() * max);
  }

  pick<T>(list: readonly T[]): T {
    return list[this.int(list.length)];
  }

  content(): string {
    const length = 8 + this.int(40);
    const chars = Array.from({ length }, () => this.pick(CONTENT_CHARS));
    chars.splice(this.int(length + 1), 0, CANARY);
    const s = chars.join('');
    this.contents.push(s);
    return s;
  }

  name(): string {
    return Array.from({ length: 1 + this.int(12) }, () => this.pick(NAME_CHARS)).join('');
  }

  number(): number {
    // Far from any count or length a summary could hold, with a fraction, so it cannot collide.
    const n = 10_000_000 + this.int(1_000_000_000) + 0.25;
    this.numbers.push(n);
    return n;
  }

  value(depth: number): unknown {
    const choice = depth >= 4 ? this.int(3) : this.int(9);
    switch (choice) {
      case 0:
        return this.content();
      case 1:
        return this.number();
      case 2:
        return this.pick([true, false, null]);
      case 3:
      case 4:
        return Array.from({ length: this.int(12) }, () => this.value(depth + 1));
      case 5:
      case 6:
        return Object.fromEntries(Array.from({ length: this.int(10) }, () => [this.name(), this.value(depth + 1)]));
      case 7:
        return this.message(depth + 1);
      default:
        return this.toolCall();
    }
  }

  part(depth: number): Record<string, unknown> {
    const extras = {
      ...(this.int(2) === 0 ? { filename: this.content() } : {}),
      ...(this.int(2) === 0 ? { mediaType: this.int(2) === 0 ? this.pick(VALID_MEDIA_TYPES) : this.content() } : {}),
      ...(this.int(3) === 0 ? { metadata: { [this.name()]: this.content() } } : {}),
    };
    switch (this.int(4)) {
      case 0:
        return { text: this.content(), ...extras };
      case 1:
        return { raw: Buffer.from(this.content()).toString('base64'), ...extras };
      case 2:
        return { url: `https://files.example/${this.content()}`, ...extras };
      default:
        return { data: this.value(depth + 1), ...extras };
    }
  }

  message(depth: number): Record<string, unknown> {
    return {
      messageId: this.content(),
      contextId: this.content(),
      role: this.int(2) === 0 ? this.pick(ROLES) : this.content(),
      parts: Array.from({ length: this.int(5) }, () => this.part(depth)),
      metadata: { [this.name()]: this.content() },
      ...(this.int(2) === 0 ? { toolCalls: [this.toolCall()] } : {}),
    };
  }

  toolCall(): Record<string, unknown> {
    const args = this.int(2) === 0 ? this.content() : { [this.name()]: this.content(), n: this.number() };
    return this.int(2) === 0
      ? { id: this.content(), name: this.name(), arguments: args }
      : { id: this.content(), type: 'function', function: { name: this.name(), arguments: args } };
  }
}

/** Every content string, number or boolean of the input that shows up in the summary. */
function leaks(summary: unknown, fuzzer: Fuzzer): string[] {
  const json = JSON.stringify(summary);
  const found: string[] = [];
  if (json.includes(CANARY)) found.push(`canary in ${json}`);
  for (const s of fuzzer.contents) {
    // Both the raw text and its JSON-escaped form (quotes, backslashes, control characters).
    if (json.includes(s) || json.includes(JSON.stringify(s).slice(1, -1))) found.push(s);
  }
  for (const n of fuzzer.numbers) if (json.includes(String(Math.trunc(n)))) found.push(String(n));
  // Summaries hold no booleans: a boolean value in the input must not come through.
  if (/[:[,](true|false)[,\]}]/.test(json)) found.push(`boolean in ${json}`);
  return found;
}

describe('no content survives summarization (randomized, seeded)', () => {
  const SEEDS = Array.from({ length: 40 }, (_, i) => i + 1);

  it.each(SEEDS)('summarizeValue, seed %i', (seed) => {
    const fuzzer = new Fuzzer(seed);
    const values = Array.from({ length: 25 }, () => fuzzer.value(0));
    const found = values.flatMap((value) => leaks(summarizeValue(value), fuzzer));
    found.push(...leaks(summarizeValue(values), fuzzer));
    expect(found).toEqual([]);
    expect(fuzzer.contents.length).toBeGreaterThan(10);
  });

  it.each(SEEDS)('summarizeMessage / summarizeParts / summarizeToolCall, seed %i', (seed) => {
    const fuzzer = new Fuzzer(1000 + seed);
    const found: string[] = [];
    for (let i = 0; i < 20; i += 1) {
      const message = fuzzer.message(0);
      found.push(...leaks(summarizeMessage(message), fuzzer));
      found.push(...leaks(summarizeParts(message.parts as unknown[]), fuzzer));
      found.push(...leaks(summarizeToolCall(fuzzer.toolCall()), fuzzer));
    }
    expect(found).toEqual([]);
    expect(fuzzer.contents.length).toBeGreaterThan(20);
  });

  it('keeps the names it is allowed to keep', () => {
    const summary = JSON.stringify(
      summarizeValue({ customer_name: 'Jane§Doe', items: [{ sku: 'A§1' }], tool: summarizeToolCall({ name: 'lookup_order', arguments: 'order§7' }) }),
    );
    for (const name of ['customer_name', 'items', 'sku', 'tool']) expect(summary).toContain(`"${name}"`);
    expect(summary).not.toContain(CANARY);
    expect(JSON.stringify(summarizeToolCall({ name: 'lookup_order', arguments: 'order§7' }))).toContain('"lookup_order"');
  });
});
