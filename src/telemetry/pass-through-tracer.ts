import { context as contextApi, INVALID_SPAN_CONTEXT, trace, type Context, type Span, type SpanOptions, type Tracer } from '@opentelemetry/api';

/**
 * The tracer a library gets from Keel's tracer provider (decision 0085): it records nothing and
 * hands out a span carrying its parent's ids, so that a Keel span started inside the library's
 * callback (a statement inside slonik's connection span) is a child of the Keel span around it,
 * not of a span that is never exported.
 */
export class PassThroughTracer implements Tracer {
  startSpan(_name: string, options?: SpanOptions, context: Context = contextApi.active()): Span {
    if (options?.root === true) return trace.wrapSpanContext(INVALID_SPAN_CONTEXT);
    const parent = trace.getSpanContext(context);
    return trace.wrapSpanContext(parent !== undefined && trace.isSpanContextValid(parent) ? parent : INVALID_SPAN_CONTEXT);
  }

  startActiveSpan<F extends (span: Span) => unknown>(name: string, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: Span) => unknown>(name: string, options: SpanOptions, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: Span) => unknown>(name: string, options: SpanOptions, context: Context, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: Span) => unknown>(name: string, ...rest: [F] | [SpanOptions, F] | [SpanOptions, Context, F]): ReturnType<F> {
    const fn = rest[rest.length - 1] as F;
    const options = rest.length > 1 ? (rest[0] as SpanOptions) : undefined;
    const active = contextApi.active();
    const parent = rest.length > 2 ? (rest[1] as Context) : active;
    const span = this.startSpan(name, options, parent);
    // Under the active context and not a root, the span carries the ids of the span already active:
    // the callback runs in that context as it is, without entering a new one (slonik starts one
    // per statement and connection, each an AsyncLocalStorage run for nothing).
    if (parent === active && options?.root !== true) return fn(span) as ReturnType<F>;
    return contextApi.with(trace.setSpan(parent, span), () => fn(span) as ReturnType<F>);
  }
}
