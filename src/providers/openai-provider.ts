import type { GuardedFetch, GuardedFetchResult } from '../net/guarded-fetch.js';
import type {
  Provider,
  ProviderCallInput,
  ProviderFailure,
  ProviderOutcome,
  ProviderReply,
  ToolCall,
  ToolSpec,
  TranscriptMessage,
} from './provider.js';
import { injectTraceHeaders } from '../tracing/trace-context.js';

// The `openai` provider: any OpenAI-compatible chat-completions endpoint, with tool calling, reached
// only through the guarded fetch. Every failure is a classified value, never an exception, and no
// failure message ever contains the API key.

export type OpenAiProviderConfig = {
  baseUrl: string;
  model: string;
  apiKeyEnv?: string | undefined;
  timeoutSeconds: number;
};

export type OpenAiProviderDeps = {
  fetch: GuardedFetch;
  env?: NodeJS.ProcessEnv;
};

/** Largest response body accepted from the endpoint. */
export const OPENAI_MAX_RESPONSE_BYTES = 16 * 1024 * 1024;

/** Longest excerpt of an endpoint's error message carried into a failure message. */
const ERROR_EXCERPT_CHARS = 200;

export type OpenAiToolCall = { id: string; type: 'function'; function: { name: string; arguments: string } };

export type OpenAiMessage =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: OpenAiToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string };

export type OpenAiTool = {
  type: 'function';
  function: { name: string; description: string; parameters: Record<string, unknown> };
};

export type OpenAiRequestBody = {
  model: string;
  messages: OpenAiMessage[];
  tools?: OpenAiTool[];
  tool_choice?: 'auto';
};

/** Maps Keel's transcript to OpenAI chat messages. */
export function toOpenAiMessages(transcript: readonly TranscriptMessage[]): OpenAiMessage[] {
  return transcript.map((message): OpenAiMessage => {
    switch (message.role) {
      case 'system':
      case 'user':
        return { role: message.role, content: message.content };
      case 'assistant': {
        const calls = message.toolCalls ?? [];
        if (calls.length === 0) return { role: 'assistant', content: message.content };
        return {
          role: 'assistant',
          content: message.content,
          tool_calls: calls.map((call) => ({
            id: call.id,
            type: 'function',
            function: { name: call.name, arguments: JSON.stringify(call.arguments) },
          })),
        };
      }
      case 'tool':
        return { role: 'tool', tool_call_id: message.toolCallId, content: message.content };
    }
  });
}

/** Maps Keel's tool specs to OpenAI function tools. */
export function toOpenAiTools(tools: readonly ToolSpec[]): OpenAiTool[] {
  return tools.map((tool) => ({
    type: 'function',
    function: { name: tool.name, description: tool.description, parameters: tool.parameters },
  }));
}

/** The request body sent to `<baseUrl>/chat/completions`. */
export function buildRequestBody(model: string, input: Pick<ProviderCallInput, 'transcript' | 'tools'>): OpenAiRequestBody {
  const body: OpenAiRequestBody = { model, messages: toOpenAiMessages(input.transcript) };
  if (input.tools.length > 0) {
    body.tools = toOpenAiTools(input.tools);
    body.tool_choice = 'auto';
  }
  return body;
}

/** `<baseUrl>/chat/completions`, tolerating a trailing slash on the base URL. */
export function chatCompletionsUrl(baseUrl: string): string {
  return baseUrl.replace(/\/+$/, '') + '/chat/completions';
}

/**
 * Parses a Retry-After value (delay in seconds, or an HTTP date) into milliseconds from `now`.
 * Returns undefined when absent or unparseable.
 */
export function parseRetryAfter(value: string | undefined, now: number = Date.now()): number | undefined {
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  if (trimmed === '') return undefined;
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Math.round(Number(trimmed) * 1000);
  // An HTTP date names its month ("Wed, 21 Oct 2026 07:28:00 GMT"); anything else (such as "-3",
  // which Date.parse would read as a year) is ignored.
  if (!/[a-z]{3}/i.test(trimmed)) return undefined;
  const date = Date.parse(trimmed);
  if (Number.isNaN(date)) return undefined;
  return Math.max(0, date - now);
}

function headerValue(headers: Record<string, string>, name: string): string | undefined {
  const wanted = name.toLowerCase();
  for (const [key, value] of Object.entries(headers)) {
    if (key.toLowerCase() === wanted) return value;
  }
  return undefined;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Removes every occurrence of the secret from a text. */
function withoutSecret(text: string, secret: string | undefined): string {
  if (secret === undefined || secret === '') return text;
  return text.split(secret).join('[redacted]');
}

/** A short excerpt of the endpoint's error message (`error.message` of an OpenAI error body), if any. */
function errorExcerpt(body: Buffer, secret: string | undefined): string | undefined {
  let message: unknown;
  try {
    const parsed: unknown = JSON.parse(body.toString('utf8'));
    message = isRecord(parsed) ? (isRecord(parsed.error) ? parsed.error.message : parsed.error) : undefined;
  } catch {
    return undefined;
  }
  if (typeof message !== 'string' || message.trim() === '') return undefined;
  // Redact before truncating so a key cut in half by the truncation cannot leak.
  const clean = withoutSecret(message, secret).replace(/\s+/g, ' ').trim();
  return clean.length > ERROR_EXCERPT_CHARS ? clean.slice(0, ERROR_EXCERPT_CHARS) + '…' : clean;
}

function httpFailure(status: number, headers: Record<string, string>, body: Buffer, secret: string | undefined): ProviderFailure {
  // Auth failures never carry the endpoint's text: some endpoints echo (part of) the key.
  const excerpt = status === 401 || status === 403 ? undefined : errorExcerpt(body, secret);
  const suffix = excerpt === undefined ? '' : `: ${excerpt}`;
  if (status === 429) {
    const failure: ProviderFailure = { class: 'rate_limit', message: `rate limited (HTTP 429)${suffix}`, status };
    const retryAfterMs = parseRetryAfter(headerValue(headers, 'retry-after'));
    if (retryAfterMs !== undefined) failure.retryAfterMs = retryAfterMs;
    return failure;
  }
  if (status === 401 || status === 403) {
    return { class: 'auth', message: `authentication refused (HTTP ${status})`, status };
  }
  if (status >= 400 && status < 500) {
    return { class: 'client_error', message: `request rejected (HTTP ${status})${suffix}`, status };
  }
  if (status >= 500) {
    return { class: 'server_error', message: `server error (HTTP ${status})${suffix}`, status };
  }
  return { class: 'unknown', message: `unexpected HTTP status ${status}`, status };
}

function fetchFailure(result: Exclude<GuardedFetchResult, { ok: true }>, secret: string | undefined): ProviderFailure {
  if (result.kind === 'refused') {
    const { host, reason, detail } = result.refusal;
    return { class: 'configuration', message: withoutSecret(`address guard refused ${host} (${reason}): ${detail}`, secret) };
  }
  const { failure } = result;
  switch (failure.class) {
    case 'timeout':
      return { class: 'connection', message: `request timed out after ${failure.durationMs} ms` };
    case 'connection':
      return { class: 'connection', message: withoutSecret(`connection failed: ${failure.message}`, secret) };
    case 'aborted':
      return { class: 'unknown', message: 'aborted' };
    case 'too_large':
      return { class: 'unknown', message: `response larger than ${OPENAI_MAX_RESPONSE_BYTES} bytes` };
    case 'protocol':
      return { class: 'unknown', message: withoutSecret(`protocol error: ${failure.message}`, secret) };
  }
}

/** Text from `message.content`: a string, null, or (some compatible servers) an array of text parts. */
function contentText(content: unknown): string | null | undefined {
  if (content === null || content === undefined) return null;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    const texts: string[] = [];
    for (const part of content) {
      if (isRecord(part) && typeof part.text === 'string') texts.push(part.text);
    }
    return texts.join('');
  }
  return undefined;
}

function nonNegativeInt(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? Math.floor(value) : 0;
}

type ParseResult = { ok: true; reply: ProviderReply } | { ok: false; failure: ProviderFailure };

/** Parses a 2xx chat-completions body: the first choice's text and tool calls, and usage. */
export function parseCompletion(body: Buffer, status: number, iteration: number): ParseResult {
  const malformed = (what: string): ParseResult => ({ ok: false, failure: { class: 'unknown', message: what, status } });
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return malformed('malformed response: body is not JSON');
  }
  if (!isRecord(parsed)) return malformed('malformed response: body is not an object');
  const choices = parsed.choices;
  if (!Array.isArray(choices) || choices.length === 0) return malformed('malformed response: no choices');
  const choice: unknown = choices[0];
  if (!isRecord(choice) || !isRecord(choice.message)) return malformed('malformed response: choice has no message');
  const message = choice.message;

  const text = contentText(message.content);
  if (text === undefined) return malformed('malformed response: unexpected message content');

  const toolCalls: ToolCall[] = [];
  const rawCalls = message.tool_calls;
  if (rawCalls !== undefined && rawCalls !== null) {
    if (!Array.isArray(rawCalls)) return malformed('malformed response: tool_calls is not a list');
    for (const [index, raw] of rawCalls.entries()) {
      if (!isRecord(raw) || !isRecord(raw.function) || typeof raw.function.name !== 'string' || raw.function.name === '') {
        return malformed('malformed tool call');
      }
      const rawArguments = raw.function.arguments;
      let args: unknown;
      if (rawArguments === undefined || rawArguments === null || (typeof rawArguments === 'string' && rawArguments.trim() === '')) {
        args = {};
      } else if (typeof rawArguments === 'string') {
        try {
          args = JSON.parse(rawArguments);
        } catch {
          return malformed('malformed tool call arguments');
        }
      } else {
        args = rawArguments;
      }
      if (!isRecord(args)) return malformed('malformed tool call arguments');
      const id = typeof raw.id === 'string' && raw.id !== '' ? raw.id : `call_${iteration}_${index}`;
      toolCalls.push({ id, name: raw.function.name, arguments: args });
    }
  }

  const usage = isRecord(parsed.usage) ? parsed.usage : {};
  return {
    ok: true,
    reply: {
      text,
      toolCalls,
      artifacts: [],
      usage: { inputTokens: nonNegativeInt(usage.prompt_tokens), outputTokens: nonNegativeInt(usage.completion_tokens) },
    },
  };
}

export function createOpenAiProvider(name: string, config: OpenAiProviderConfig, deps: OpenAiProviderDeps): Provider {
  const url = chatCompletionsUrl(config.baseUrl);
  const timeoutMs = Math.max(1, Math.round(config.timeoutSeconds * 1000));
  return {
    name,
    type: 'openai',
    model: config.model,
    call: async (input: ProviderCallInput): Promise<ProviderOutcome> => {
      const env = deps.env ?? process.env;
      let apiKey: string | undefined;
      if (config.apiKeyEnv !== undefined) {
        apiKey = env[config.apiKeyEnv];
        if (apiKey === undefined || apiKey === '') {
          return {
            ok: false,
            failure: { class: 'configuration', message: `environment variable ${config.apiKeyEnv} (API key for provider ${name}) is not set` },
          };
        }
      }
      if (input.signal.aborted) return { ok: false, failure: { class: 'unknown', message: 'aborted' } };

      const headers: Record<string, string> = { 'content-type': 'application/json', accept: 'application/json' };
      if (apiKey !== undefined) headers.authorization = `Bearer ${apiKey}`;
      // The model call's span (src/tracing/gen-ai-spans.ts) as the parent of the provider's own, while tracing is on.
      injectTraceHeaders(headers);

      let result: GuardedFetchResult;
      try {
        result = await deps.fetch({
          url,
          method: 'POST',
          headers,
          body: JSON.stringify(buildRequestBody(config.model, input)),
          timeoutMs,
          signal: input.signal,
          maxResponseBytes: OPENAI_MAX_RESPONSE_BYTES,
        });
      } catch (error) {
        // The guarded fetch reports failures as values; this is only a safety net.
        const detail = error instanceof Error ? error.message : String(error);
        return { ok: false, failure: { class: 'unknown', message: withoutSecret(`request failed: ${detail}`, apiKey) } };
      }

      if (!result.ok) return { ok: false, failure: fetchFailure(result, apiKey) };
      const { status, headers: responseHeaders, body } = result.response;
      if (status < 200 || status >= 300) return { ok: false, failure: httpFailure(status, responseHeaders, body, apiKey) };
      return parseCompletion(body, status, input.iteration);
    },
  };
}
