import type { KeelLogger } from '../log/logger.js';
import type { GuardedFetch } from '../net/guarded-fetch.js';

// A tool an agent may call. It declares its effect, so the executor knows what a retry would do,
// and whether a person must approve each call before it runs.

export const TOOL_EFFECTS = ['read_only', 'idempotent_write', 'non_idempotent_write'] as const;
export type ToolEffect = (typeof TOOL_EFFECTS)[number];

export type ToolContext = {
  runId: string;
  agentId: string;
  toolCallId: string;
  fetch: GuardedFetch;
  signal: AbortSignal;
  logger: KeelLogger;
};

/** What a tool call produced: content for the model, an error the model is told about, or a request for typed user input. */
export type ToolResult =
  | { kind: 'ok'; content: unknown }
  | { kind: 'error'; message: string }
  | { kind: 'input_required'; prompt: string; schema: Record<string, unknown> }
  /** The call was handed to a remote agent; the run waits on this dependency. */
  | { kind: 'dependency'; dependencyId: string };

export type ToolDefinition = {
  name: string;
  description: string;
  /** JSON Schema of the arguments, shown to the model. */
  parameters: Record<string, unknown>;
  effect: ToolEffect;
  needsApproval: boolean;
  run: (args: Record<string, unknown>, context: ToolContext) => Promise<ToolResult>;
};
