import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, RandomIdGenerator, SimpleSpanProcessor, type IdGenerator, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { KeelTracerProvider } from '../../src/telemetry/keel-tracer-provider.js';
import { takeRequestedSpanId } from '../../src/tracing/requested-span-id.js';
import { setTracingEnabled } from '../../src/tracing/tracing-switch.js';

// Tracing for a test process: a tracer provider whose spans stay in memory, the context manager
// Keel's SDK wiring registers (AsyncLocalStorage), and an id generator that gives a span the id
// Keel asked for (src/tracing/requested-span-id.ts), as Keel's own wiring does; libraries get the
// pass-through tracer, as under Keel's wiring (decision 0085). A library that keeps the tracer it
// got (slonik's ProxyTracer keeps its first delegate) would otherwise keep this provider's for
// the rest of a test process that runs several files, and put unexported spans between a later
// file's Keel spans.

export type InMemoryTracing = {
  /** Every span ended so far. */
  spans: () => ReadableSpan[];
  /** The spans of one trace. */
  spansOf: (traceId: string) => ReadableSpan[];
  reset: () => void;
  stop: () => Promise<void>;
};

const random = new RandomIdGenerator();
const honouringRequests: IdGenerator = {
  generateTraceId: () => random.generateTraceId(),
  generateSpanId: () => takeRequestedSpanId() ?? random.generateSpanId(),
};

/** Registers the provider globally and turns Keel's tracing on. */
export function startInMemoryTracing(): InMemoryTracing {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ idGenerator: honouringRequests, spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const manager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(manager);
  trace.setGlobalTracerProvider(new KeelTracerProvider(provider));
  setTracingEnabled(true);
  return {
    spans: () => exporter.getFinishedSpans(),
    spansOf: (traceId) => exporter.getFinishedSpans().filter((span) => span.spanContext().traceId === traceId),
    reset: () => exporter.reset(),
    stop: async () => {
      setTracingEnabled(false);
      await provider.shutdown();
      trace.disable();
      context.disable();
    },
  };
}
