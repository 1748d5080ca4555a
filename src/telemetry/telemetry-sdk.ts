import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter as JsonTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtobufTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { defaultResource, resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  RandomIdGenerator,
  TraceIdRatioBasedSampler,
  type Sampler,
  type SpanExporter,
} from '@opentelemetry/sdk-trace-base';
import { ATTR_SERVICE_INSTANCE_ID, ATTR_SERVICE_NAME } from '@opentelemetry/semantic-conventions';
import { setTracingEnabled } from '../tracing/tracing-switch.js';
import { KeelTracerProvider } from './keel-tracer-provider.js';
import { LinkedTraceSampler } from './linked-trace-sampler.js';
import { RequestedIdGenerator } from './requested-id-generator.js';
import type { SamplerName, TelemetrySettings } from './telemetry-settings.js';

// The OpenTelemetry SDK itself. This module is only ever loaded by a dynamic import from
// start-telemetry.ts, when tracing is configured: a Keel without it loads none of the SDK.

/** Which process of an installation sent a span (`keel start --role`). */
export const ATTR_KEEL_PROCESS_ROLE = 'keel.process.role';

export type TelemetryIdentity = { role: 'all' | 'api' | 'worker'; instanceId: string };

export type WiredTelemetry = { ok: true; shutdown: () => Promise<'flushed' | 'timed out' | 'failed'> } | { ok: false; message: string };

function samplerFor(name: SamplerName, ratio: number): Sampler {
  switch (name) {
    case 'always_on':
      return new AlwaysOnSampler();
    case 'always_off':
      return new AlwaysOffSampler();
    case 'traceidratio':
      return new TraceIdRatioBasedSampler(ratio);
    case 'parentbased_always_on':
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio) });
  }
}

function exporterFor(settings: TelemetrySettings): SpanExporter {
  // The exporter sends with Node's own http/https modules, not through Keel's address guard
  // (src/net/guarded-fetch.ts): the collector is the operator's own, often on loopback or a
  // private network the guard refuses (decision 0084).
  const options = { url: settings.tracesUrl, headers: settings.headers, timeoutMillis: settings.exportTimeoutMs };
  return settings.protocol === 'http/json' ? new JsonTraceExporter(options) : new ProtobufTraceExporter(options);
}

/**
 * Registers a tracer provider exporting over OTLP/HTTP through a BatchSpanProcessor, the W3C trace
 * context propagator and the AsyncLocalStorage context manager, then turns Keel's tracing on.
 * `exporter` replaces the OTLP exporter (bench:tracing's, which drops what it is given, to
 * measure the recording apart from the export).
 */
export function wireTelemetry(settings: TelemetrySettings, identity: TelemetryIdentity, exporter: SpanExporter = exporterFor(settings)): WiredTelemetry {
  const resource = defaultResource().merge(
    resourceFromAttributes({
      [ATTR_SERVICE_INSTANCE_ID]: identity.instanceId,
      ...settings.resourceAttributes,
      [ATTR_SERVICE_NAME]: settings.resourceAttributes[ATTR_SERVICE_NAME],
      [ATTR_KEEL_PROCESS_ROLE]: identity.role,
    }),
  );
  const provider = new BasicTracerProvider({
    resource,
    // A batch span, the root of its own trace, is kept when a task it wrote was (linked-trace-sampler.ts).
    sampler: new LinkedTraceSampler(samplerFor(settings.sampler, settings.samplerRatio)),
    idGenerator: new RequestedIdGenerator(new RandomIdGenerator()),
    spanProcessors: [new BatchSpanProcessor(exporter, { exportTimeoutMillis: settings.exportTimeoutMs })],
  });
  if (!trace.setGlobalTracerProvider(new KeelTracerProvider(provider))) {
    void provider.shutdown().catch(() => undefined);
    return {
      ok: false,
      message:
        'an OpenTelemetry tracer provider is already registered in this process (a preloaded SDK, or another Keel started in it): turn telemetry off in the config (telemetry.enabled: false or OTEL_SDK_DISABLED=true) or remove the other SDK',
    };
  }
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  setTracingEnabled(true);

  let stopped: Promise<'flushed' | 'timed out' | 'failed'> | null = null;
  const shutdown = () =>
    (stopped ??= (async () => {
      // Spans ended from here on are not recorded; those buffered are exported within the bound.
      setTracingEnabled(false);
      let timer: NodeJS.Timeout | undefined;
      const bound = new Promise<'timed out'>((resolve) => {
        timer = setTimeout(resolve, settings.shutdownTimeoutMs, 'timed out');
        timer.unref();
      });
      const outcome = await Promise.race([provider.shutdown().then(() => 'flushed' as const, () => 'failed' as const), bound]);
      clearTimeout(timer);
      trace.disable();
      propagation.disable();
      context.disable();
      return outcome;
    })());
  return { ok: true, shutdown };
}
