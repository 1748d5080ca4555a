import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, it, expect } from 'vitest';
import { createGuardedFetch, type ClosableGuardedFetch } from '../../../src/net/guarded-fetch.js';
import { createOpenAiProvider, type OpenAiProviderConfig } from '../../../src/providers/openai-provider.js';
import type { ProviderCallInput, ProviderOutcome, ToolSpec, TranscriptMessage } from '../../../src/providers/provider.js';

// A real OpenAI-compatible endpoint on 127.0.0.1, reached through the real guarded fetch. The first
// path segment picks the behaviour: http://127.0.0.1:<port>/<scenario>/v1/chat/completions.

type Received = { method: string; url: string; headers: IncomingMessage['headers']; body: string };

const API_KEY = 'sk-test-0123456789abcdef-secret';
const KEY_ENV = 'KEEL_TEST_OPENAI_KEY';

let server: Server;
let baseOrigin: string;
let received: Received[] = [];
const hanging = new Set<ServerResponse>();
const guardedFetch: ClosableGuardedFetch = createGuardedFetch({ allowHosts: ['127.0.0.1'], allowHttp: true });

function json(res: ServerResponse, status: number, value: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(value));
}

function completion(message: Record<string, unknown>, usage?: Record<string, number>): Record<string, unknown> {
  return {
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1,
    model: 'fake-model',
    choices: [{ index: 0, message: { role: 'assistant', ...message }, finish_reason: 'stop' }],
    ...(usage === undefined ? {} : { usage }),
  };
}

function handle(scenario: string, res: ServerResponse): void {
  const apiError = (status: number, message: string, headers: Record<string, string> = {}): void =>
    json(res, status, { error: { message, type: 'test_error' } }, headers);
  switch (scenario) {
    case 'text':
      return json(res, 200, completion({ content: 'Hello from the fake model' }, { prompt_tokens: 17, completion_tokens: 6, total_tokens: 23 }));
    case 'tools':
      return json(
        res,
        200,
        completion(
          {
            content: null,
            tool_calls: [
              { id: 'call_abc', type: 'function', function: { name: 'http_get', arguments: '{"url":"https://example.com/a"}' } },
              { id: 'call_def', type: 'function', function: { name: 'lookup', arguments: '{"q":"keel","limit":3}' } },
            ],
          },
          { prompt_tokens: 40, completion_tokens: 12 },
        ),
      );
    case 'bad-args':
      return json(
        res,
        200,
        completion({ content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{"url": ' } }] }),
      );
    case 'rate-seconds':
      return apiError(429, 'slow down', { 'retry-after': '7' });
    case 'rate-date':
      return apiError(429, 'slow down', { 'retry-after': new Date(Date.now() + 60_000).toUTCString() });
    case 'rate-none':
      return apiError(429, 'slow down');
    case 'unauthorized':
      return apiError(401, `Incorrect API key provided: ${API_KEY}`);
    case 'forbidden':
      return apiError(403, 'forbidden');
    case 'bad-request':
      return apiError(400, `bad request (you sent key ${API_KEY})`);
    case 'not-found':
      return apiError(404, 'The model does not exist');
    case 'unprocessable':
      return apiError(422, 'unprocessable');
    case 'teapot':
      return apiError(418, 'teapot');
    case 'server-error':
      return apiError(500, 'internal error');
    case 'unavailable':
      res.writeHead(503, { 'content-type': 'text/plain' });
      res.end('upstream unavailable');
      return;
    case 'garbage':
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('<html>definitely not json');
      return;
    case 'no-choices':
      return json(res, 200, { id: 'x', choices: [] });
    case 'hang':
      hanging.add(res);
      res.on('close', () => hanging.delete(res));
      return; // never answers
    default:
      return apiError(404, `unknown scenario ${scenario}`);
  }
}

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      received.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
      const [, scenario = '', ...rest] = (req.url ?? '').split('/');
      if (req.method !== 'POST' || rest.join('/') !== 'v1/chat/completions') {
        json(res, 404, { error: { message: `unexpected ${req.method} ${req.url}` } });
        return;
      }
      handle(scenario, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseOrigin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await guardedFetch.close();
  for (const res of hanging) res.destroy();
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

beforeEach(() => {
  received = [];
});

const env = { [KEY_ENV]: API_KEY };

function provider(scenario: string, overrides: Partial<OpenAiProviderConfig> = {}, envOverride: NodeJS.ProcessEnv = env) {
  return createOpenAiProvider(
    'fake-openai',
    { baseUrl: `${baseOrigin}/${scenario}/v1`, model: 'fake-model', apiKeyEnv: KEY_ENV, timeoutSeconds: 5, ...overrides },
    { fetch: guardedFetch, env: envOverride },
  );
}

const transcript: TranscriptMessage[] = [
  { role: 'system', content: 'You are a test agent.' },
  { role: 'user', content: 'Fetch example.com' },
  {
    role: 'assistant',
    content: null,
    toolCalls: [{ id: 'call_0_0', name: 'http_get', arguments: { url: 'https://example.com', headers: { accept: 'text/html' } } }],
  },
  { role: 'tool', toolCallId: 'call_0_0', name: 'http_get', content: '<html>example</html>' },
  { role: 'assistant', content: 'It is an example page.' },
  { role: 'user', content: 'Thanks, and now?' },
];

const tools: ToolSpec[] = [
  {
    name: 'http_get',
    description: 'Fetches a URL',
    parameters: { type: 'object', properties: { url: { type: 'string' } }, required: ['url'] },
  },
];

function input(overrides: Partial<ProviderCallInput> = {}): ProviderCallInput {
  return { runId: 'run-1', iteration: 1, transcript, tools, signal: new AbortController().signal, ...overrides };
}

function failureOf(outcome: ProviderOutcome) {
  if (outcome.ok) throw new Error(`expected a failure, got a reply: ${JSON.stringify(outcome.reply)}`);
  expect(outcome.failure.message).not.toContain(API_KEY);
  return outcome.failure;
}

describe('openai provider against a fake endpoint: requests and replies', () => {
  it('sends the model, mapped messages (tool calls and tool results included), tools and the Bearer key', async () => {
    const outcome = await provider('text').call(input());
    expect(outcome.ok).toBe(true);
    expect(received).toHaveLength(1);
    const request = received[0]!;
    expect(request.method).toBe('POST');
    expect(request.url).toBe('/text/v1/chat/completions');
    expect(request.headers['content-type']).toBe('application/json');
    expect(request.headers.authorization).toBe(`Bearer ${API_KEY}`);
    const body = JSON.parse(request.body) as Record<string, unknown>;
    expect(body).toEqual({
      model: 'fake-model',
      messages: [
        { role: 'system', content: 'You are a test agent.' },
        { role: 'user', content: 'Fetch example.com' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [
            {
              id: 'call_0_0',
              type: 'function',
              function: { name: 'http_get', arguments: JSON.stringify({ url: 'https://example.com', headers: { accept: 'text/html' } }) },
            },
          ],
        },
        { role: 'tool', tool_call_id: 'call_0_0', content: '<html>example</html>' },
        { role: 'assistant', content: 'It is an example page.' },
        { role: 'user', content: 'Thanks, and now?' },
      ],
      tools: [
        {
          type: 'function',
          function: {
            name: 'http_get',
            description: 'Fetches a URL',
            parameters: { type: 'object', properties: { url: { type: 'string' } }, required: ['url'] },
          },
        },
      ],
      tool_choice: 'auto',
    });
  });

  it('sends no tools or tool_choice without tools, and no authorization header without apiKeyEnv', async () => {
    const outcome = await provider('text', { apiKeyEnv: undefined }).call(input({ tools: [] }));
    expect(outcome.ok).toBe(true);
    const request = received[0]!;
    expect(request.headers.authorization).toBeUndefined();
    const body = JSON.parse(request.body) as Record<string, unknown>;
    expect(body).not.toHaveProperty('tools');
    expect(body).not.toHaveProperty('tool_choice');
  });

  it('tolerates a trailing slash on baseUrl', async () => {
    const outcome = await provider('text', { baseUrl: `${baseOrigin}/text/v1/` }).call(input());
    expect(outcome.ok).toBe(true);
    expect(received[0]!.url).toBe('/text/v1/chat/completions');
  });

  it('returns a text reply with usage', async () => {
    expect(await provider('text').call(input())).toEqual({
      ok: true,
      reply: { text: 'Hello from the fake model', toolCalls: [], artifacts: [], usage: { inputTokens: 17, outputTokens: 6 } },
    });
  });

  it('returns tool calls with parsed arguments and usage', async () => {
    expect(await provider('tools').call(input())).toEqual({
      ok: true,
      reply: {
        text: null,
        toolCalls: [
          { id: 'call_abc', name: 'http_get', arguments: { url: 'https://example.com/a' } },
          { id: 'call_def', name: 'lookup', arguments: { q: 'keel', limit: 3 } },
        ],
        artifacts: [],
        usage: { inputTokens: 40, outputTokens: 12 },
      },
    });
  });

  it('classifies unparseable tool call arguments as unknown', async () => {
    const failure = failureOf(await provider('bad-args').call(input()));
    expect(failure).toEqual({ class: 'unknown', message: 'malformed tool call arguments', status: 200 });
  });
});

describe('openai provider against a fake endpoint: error classes', () => {
  it('connection: a closed port', async () => {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const closedPort = (probe.address() as AddressInfo).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const failure = failureOf(await provider('text', { baseUrl: `http://127.0.0.1:${closedPort}/v1` }).call(input()));
    expect(failure.class).toBe('connection');
    expect(failure.status).toBeUndefined();
  });

  it('connection: a server that never answers, with timeoutSeconds 0.3', async () => {
    const started = performance.now();
    const failure = failureOf(await provider('hang', { timeoutSeconds: 0.3 }).call(input()));
    const elapsed = performance.now() - started;
    expect(failure.class).toBe('connection');
    expect(elapsed).toBeGreaterThanOrEqual(250);
    expect(elapsed).toBeLessThan(3_000);
    expect(received).toHaveLength(1);
  });

  it('an abort through input.signal ends a hanging call quickly', async () => {
    const controller = new AbortController();
    const started = performance.now();
    const pending = provider('hang').call(input({ signal: controller.signal }));
    setTimeout(() => controller.abort(), 100);
    const failure = failureOf(await pending);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(failure).toEqual({ class: 'unknown', message: 'aborted' });
  });

  it('rate_limit: 429 with Retry-After in seconds', async () => {
    const failure = failureOf(await provider('rate-seconds').call(input()));
    expect(failure).toMatchObject({ class: 'rate_limit', status: 429, retryAfterMs: 7000 });
  });

  it('rate_limit: 429 with Retry-After as an HTTP date', async () => {
    const failure = failureOf(await provider('rate-date').call(input()));
    expect(failure).toMatchObject({ class: 'rate_limit', status: 429 });
    expect(failure.retryAfterMs).toBeGreaterThan(50_000);
    expect(failure.retryAfterMs).toBeLessThanOrEqual(60_000);
  });

  it('rate_limit: 429 without Retry-After has no retryAfterMs', async () => {
    const failure = failureOf(await provider('rate-none').call(input()));
    expect(failure).toMatchObject({ class: 'rate_limit', status: 429 });
    expect(failure.retryAfterMs).toBeUndefined();
  });

  it.each([
    ['unauthorized', 401],
    ['forbidden', 403],
  ])('auth: %s (%i), without echoing the endpoint text or the key', async (scenario, status) => {
    const failure = failureOf(await provider(scenario).call(input()));
    expect(failure).toMatchObject({ class: 'auth', status });
    expect(failure.message).not.toMatch(/sk-/);
  });

  it.each([
    ['bad-request', 400],
    ['not-found', 404],
    ['unprocessable', 422],
    ['teapot', 418],
  ])('client_error: %s (%i)', async (scenario, status) => {
    const failure = failureOf(await provider(scenario).call(input()));
    expect(failure).toMatchObject({ class: 'client_error', status });
  });

  it('client_error: an endpoint message quoting the key is redacted', async () => {
    const failure = failureOf(await provider('bad-request').call(input()));
    expect(failure.message).toContain('[redacted]');
  });

  it.each([
    ['server-error', 500],
    ['unavailable', 503],
  ])('server_error: %s (%i)', async (scenario, status) => {
    const failure = failureOf(await provider(scenario).call(input()));
    expect(failure).toMatchObject({ class: 'server_error', status });
  });

  it.each([['garbage'], ['no-choices']])('unknown: 200 with %s', async (scenario) => {
    const failure = failureOf(await provider(scenario).call(input()));
    expect(failure).toMatchObject({ class: 'unknown', status: 200 });
  });

  it.each([
    ['unset', {}],
    ['empty', { [KEY_ENV]: '' }],
  ])('configuration: API key env var %s, and no request is made', async (_label, envOverride) => {
    const failure = failureOf(await provider('text', {}, envOverride).call(input()));
    expect(failure.class).toBe('configuration');
    expect(failure.message).toContain(KEY_ENV);
    expect(received).toHaveLength(0);
  });

  it('configuration: the address guard refuses a host outside the allowlist', async () => {
    const started = performance.now();
    const failure = failureOf(await provider('text', { baseUrl: 'http://10.0.0.1/v1' }).call(input()));
    expect(failure.class).toBe('configuration');
    expect(failure.status).toBeUndefined();
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(received).toHaveLength(0);
  });
});
