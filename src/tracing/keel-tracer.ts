import { context, SpanStatusCode, trace, type Context, type Span, type SpanOptions, type Tracer } from '@opentelemetry/api';
import { tracingGeneration } from './tracing-switch.js';

// Keel's tracer and the one way its instrumented places run work inside a span. Callers check
// tracingEnabled() (tracing-switch.ts) first, so nothing here runs while tracing is off.

/** The instrumentation scope of every Keel span. */
export const TRACER_NAME = 'keel';

let cached: { generation: number; tracer: Tracer } | null = null;

/**
 * Keel's tracer from the registered provider (the API's no-op one when none is), looked up once per
 * turn of the tracing switch: the SDK wiring registers its provider before it turns tracing on, and
 * the lookup (the API's proxy, Keel's provider, the SDK's tracer map) was part of every span's cost.
 */
export function keelTracer(): Tracer {
  const generation = tracingGeneration();
  if (cached?.generation !== generation) cached = { generation, tracer: trace.getTracer(TRACER_NAME) };
  return cached.tracer;
}

/**
 * Runs `work` with a new span active (its children parent to it), ending the span when the work
 * settles; a thrown error marks it ERROR with the error's class, never its message (which may
 * quote content).
 */
export async function inSpan<T>(name: string, options: SpanOptions, parent: Context | undefined, work: (span: Span) => Promise<T>): Promise<T> {
  return keelTracer().startActiveSpan(name, options, parent ?? context.active(), async (span) => {
    try {
      return await work(span);
    } catch (error) {
      markFailed(span, error);
      throw error;
    } finally {
      span.end();
    }
  });
}

/** A span's ERROR status from a thrown value: its class name only (a message may carry content or a credential). */
export function markFailed(span: Span, error: unknown): void {
  const type = error instanceof Error ? error.name : typeof error;
  span.setAttribute('error.type', type);
  span.setStatus({ code: SpanStatusCode.ERROR, message: type });
}
