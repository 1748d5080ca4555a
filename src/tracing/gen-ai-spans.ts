import { SpanKind } from '@opentelemetry/api';
import { inSpan } from './keel-tracer.js';

// The GenAI semantic conventions' spans of a run's steps: one per model call (each attempt) and
// one per tool call. Names, ids, counts and outcomes only: never a prompt, a reply, a tool's
// arguments or result, at any privacy level. The shapes below are what the spans read of a
// provider, its outcome, a tool call and its result (src/providers/, src/tools/), written out so
// that tracing stays below the folders it traces (test/unit/layout/import-layers.test.ts).

/** What a model call's span reads of its provider. */
export type TracedProvider = { name: string; type: string; model?: string | null };
/** What a model call's span reads of its outcome. */
export type TracedModelOutcome =
  | { ok: true; reply: { usage: { inputTokens: number; outputTokens: number }; toolCalls: readonly unknown[] } }
  | { ok: false; failure: { class: string; status?: number } };

/** One model call: `chat <model>`, with the tokens the provider reported. */
export function inModelCallSpan<Outcome extends TracedModelOutcome>(provider: TracedProvider, step: { iteration: number; attempt: number }, call: () => Promise<Outcome>): Promise<Outcome> {
  const model = provider.model ?? provider.name;
  return inSpan(
    `chat ${model}`,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        'gen_ai.operation.name': 'chat',
        'gen_ai.request.model': model,
        'gen_ai.provider.name': provider.type,
        'gen_ai.system': provider.type,
        'keel.provider.name': provider.name,
        'keel.model_call.iteration': step.iteration,
        'keel.model_call.attempt': step.attempt,
      },
    },
    undefined,
    async (span) => {
      const outcome = await call();
      if (outcome.ok) {
        span.setAttribute('gen_ai.usage.input_tokens', outcome.reply.usage.inputTokens);
        span.setAttribute('gen_ai.usage.output_tokens', outcome.reply.usage.outputTokens);
        span.setAttribute('gen_ai.response.finish_reasons', [outcome.reply.toolCalls.length > 0 ? 'tool_calls' : 'stop']);
      } else {
        span.setAttribute('error.type', outcome.failure.class);
        if (outcome.failure.status !== undefined) span.setAttribute('http.response.status_code', outcome.failure.status);
      }
      return outcome;
    },
  );
}

/** One tool call: `execute_tool <tool>`, with its outcome's kind. */
export function inToolSpan<Result extends { kind: string }>(call: { id: string; name: string }, effect: string, run: () => Promise<Result>): Promise<Result> {
  return inSpan(
    `execute_tool ${call.name}`,
    {
      kind: SpanKind.INTERNAL,
      attributes: {
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': call.name,
        'gen_ai.tool.call.id': call.id,
        'keel.tool.effect': effect,
      },
    },
    undefined,
    async (span) => {
      const result = await run();
      span.setAttribute('keel.tool.outcome', result.kind);
      if (result.kind === 'error') span.setAttribute('error.type', 'tool_error');
      return result;
    },
  );
}
