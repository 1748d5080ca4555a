import type { ProviderErrorClass } from '../config/config-schema.js';

// One interface for every model provider. A provider turns a transcript into one reply: text, tool
// calls, artifacts, or a classified failure. Failures are values, never exceptions.

export type { ProviderErrorClass };

/** An A2A part as Keel stores it (exactly one of text, raw, url, data). */
export type Part =
  | { text: string; mediaType?: string; filename?: string; metadata?: Record<string, unknown> }
  | { raw: string; mediaType?: string; filename?: string; metadata?: Record<string, unknown> }
  | { url: string; mediaType?: string; filename?: string; metadata?: Record<string, unknown> }
  | { data: unknown; mediaType?: string; filename?: string; metadata?: Record<string, unknown> };

export type ToolCall = { id: string; name: string; arguments: Record<string, unknown> };

export type TranscriptMessage =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string }
  | { role: 'assistant'; content: string | null; toolCalls?: ToolCall[] }
  | { role: 'tool'; toolCallId: string; name: string; content: string };

/** What a model is told about a tool: JSON Schema for its arguments. */
export type ToolSpec = { name: string; description: string; parameters: Record<string, unknown> };

/** An artifact (or one chunk of it) that the agent emits during the run. */
export type ArtifactEmission = {
  artifactId?: string;
  name?: string;
  description?: string;
  parts: Part[];
  append?: boolean;
  lastChunk?: boolean;
};

export type ProviderUsage = { inputTokens: number; outputTokens: number };

/**
 * How a final reply is presented to an A2A client, when not as the default answer artifact:
 * as the task's final status message, as a direct Message (no task shown), a rejection of the
 * task, or a request for more input from the user (INPUT_REQUIRED).
 */
export type ReplyOutcome =
  | { kind: 'status_message'; text: string }
  | { kind: 'direct_message'; text: string }
  | { kind: 'reject'; reason: string }
  | { kind: 'input_required'; prompt: string };

export type ProviderReply = {
  /** Final answer text when there are no tool calls. */
  text: string | null;
  toolCalls: ToolCall[];
  artifacts: ArtifactEmission[];
  usage: ProviderUsage;
  /** Absent: the text (if any) is the answer artifact. */
  outcome?: ReplyOutcome;
};

export type ProviderFailure = {
  class: ProviderErrorClass;
  message: string;
  /** HTTP status or similar, for the audit trail. */
  status?: number;
  /** From Retry-After, when the provider said how long to wait. */
  retryAfterMs?: number;
};

export type ProviderOutcome = { ok: true; reply: ProviderReply } | { ok: false; failure: ProviderFailure };

export type ProviderCallInput = {
  runId: string;
  /** 0-based index of this model call within the run (scripted steps are chosen by it). */
  iteration: number;
  transcript: readonly TranscriptMessage[];
  tools: readonly ToolSpec[];
  signal: AbortSignal;
  /** What the layer that created the run recorded with it (the A2A messageId of the latest message). */
  requestMetadata?: Record<string, unknown>;
};

export type Provider = {
  readonly name: string;
  readonly type: 'echo' | 'scripted' | 'openai' | 'conformance';
  /** The model it asks for, when it names one (its spans' `gen_ai.request.model`). */
  readonly model?: string;
  call: (input: ProviderCallInput) => Promise<ProviderOutcome>;
};

/** Classes a caller may retry or fall back from; the rest (auth, configuration, client_error) are not retryable. */
export const RETRYABLE_PROVIDER_CLASSES: readonly ProviderErrorClass[] = ['connection', 'rate_limit', 'server_error', 'unknown'];

export function isRetryableClass(errorClass: ProviderErrorClass): boolean {
  return RETRYABLE_PROVIDER_CLASSES.includes(errorClass);
}
