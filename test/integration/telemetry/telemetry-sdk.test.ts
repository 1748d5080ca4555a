import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { ROOT_CONTEXT, trace, TraceFlags } from '@opentelemetry/api';
import { sql } from 'slonik';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { configSchema } from '../../../src/config/config-schema.js';
import { createLogger, silentLogger } from '../../../src/log/logger.js';
import { startTelemetry, type Telemetry } from '../../../src/telemetry/start-telemetry.js';
import { startSpanWithId } from '../../../src/tracing/requested-span-id.js';
import { tracingEnabled } from '../../../src/tracing/tracing-switch.js';
import { startOtlpReceiver, type OtlpReceiver } from '../../support/otlp-receiver.js';
import { createTestDatabase, type TestDatabase } from '../../support/test-database.js';

// The OpenTelemetry SDK wiring of src/telemetry/ in this process, exporting over OTLP/HTTP (JSON)
// to a receiver on loopback: resource, ids asked for, library spans left out, log lines with the
// active span's ids, and a shutdown bounded when the collector does not answer.

const identity = { role: 'api' as const, instanceId: 'host:1:abcd' };
const receivers: OtlpReceiver[] = [];
let database: TestDatabase | null = null;
let wired: Telemetry | null = null;

afterEach(async () => {
  await wired?.shutdown();
  wired = null;
});

afterAll(async () => {
  for (const receiver of receivers) await receiver.close();
  await database?.drop();
});

async function receiver(): Promise<OtlpReceiver> {
  const started = await startOtlpReceiver();
  receivers.push(started);
  return started;
}

async function wire(telemetry: Record<string, unknown>, env: NodeJS.ProcessEnv = {}): Promise<Telemetry> {
  const started = await startTelemetry(configSchema.parse({ telemetry }).telemetry, env, identity, silentLogger());
  if (!started.ok) throw new Error(started.message);
  wired = started.telemetry;
  return started.telemetry;
}

function lineCollector(): { lines: Array<Record<string, unknown>>; stream: Writable } {
  const lines: Array<Record<string, unknown>> = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      for (const line of chunk.toString('utf8').split('\n')) if (line.trim() !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
      callback();
    },
  });
  return { lines, stream };
}

describe('the SDK wired by src/telemetry/', () => {
  it('exports Keel spans over OTLP/HTTP with the resource, the headers and the span id asked for', async () => {
    const collector = await receiver();
    const telemetry = await wire(
      { endpoint: collector.url, protocol: 'http/json', resourceAttributes: { 'deployment.environment.name': 'test' } },
      { OTEL_EXPORTER_OTLP_HEADERS: 'x-collector-key=k%20one', OTEL_RESOURCE_ATTRIBUTES: 'team=agents' },
    );
    expect(telemetry.wired).toBe(true);
    expect(tracingEnabled()).toBe(true);
    const tracer = trace.getTracer('keel');
    tracer.startActiveSpan('outer', (outer) => {
      startSpanWithId('00f067aa0ba902b7', () => tracer.startSpan('inner')).end();
      // Not 16 lowercase hex digits: the SDK's own random id instead.
      startSpanWithId('NOT-A-SPAN-ID', () => tracer.startSpan('random id')).end();
      outer.end();
    });
    await telemetry.shutdown();
    expect(tracingEnabled()).toBe(false);

    const spans = await collector.waitFor((received) => received.length >= 3);
    const byName = new Map(spans.map((span) => [span.name, span]));
    const outer = byName.get('outer')!;
    expect(byName.get('inner')).toMatchObject({ spanId: '00f067aa0ba902b7', parentSpanId: outer.spanId, traceId: outer.traceId });
    expect(byName.get('random id')!.spanId).toMatch(/^[0-9a-f]{16}$/);
    expect(byName.get('random id')!.spanId).not.toBe('00f067aa0ba902b7');
    expect(outer.scope).toBe('keel');
    expect(outer.resource).toMatchObject({
      'service.name': 'keel',
      'service.instance.id': 'host:1:abcd',
      'keel.process.role': 'api',
      'deployment.environment.name': 'test',
      team: 'agents',
    });
    expect(collector.requests[0]).toMatchObject({ path: '/v1/traces', contentType: 'application/json' });
    expect(collector.requests[0]!.headers['x-collector-key']).toBe('k one');
  });

  it("under a ratio sampler a root span linked to a kept trace is kept (a batch that wrote a kept task), one linked only to dropped traces is not", async () => {
    const collector = await receiver();
    // No new trace is kept (ratio 0): only a caller's sampled traceparent keeps one.
    const telemetry = await wire({ endpoint: collector.url, protocol: 'http/json', sampler: 'parentbased_traceidratio', samplerRatio: 0 });
    const tracer = trace.getTracer('keel');
    const kept = { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', traceFlags: TraceFlags.SAMPLED, isRemote: true };
    const dropped = { traceId: '5bf92f3577b34da6a3ce929d0e0e4737', spanId: '10f067aa0ba902b8', traceFlags: TraceFlags.NONE, isRemote: true };
    tracer.startSpan('A2A SendMessage', {}, trace.setSpanContext(ROOT_CONTEXT, kept)).end();
    tracer.startSpan('A2A SendMessage (not sampled)', {}, trace.setSpanContext(ROOT_CONTEXT, dropped)).end();
    tracer.startSpan('keel.write_batch (a kept task)', { links: [{ context: dropped }, { context: kept }] }, ROOT_CONTEXT).end();
    tracer.startSpan('keel.write_batch (dropped tasks)', { links: [{ context: dropped }] }, ROOT_CONTEXT).end();
    tracer.startSpan('a new trace', {}, ROOT_CONTEXT).end();
    await telemetry.shutdown();

    const spans = await collector.waitFor((received) => received.length >= 2);
    expect(spans.map((span) => span.name).sort()).toEqual(['A2A SendMessage', 'keel.write_batch (a kept task)']);
    const batch = spans.find((span) => span.name === 'keel.write_batch (a kept task)')!;
    expect(batch.parentSpanId).toBeNull();
    expect(batch.links).toEqual([
      { traceId: dropped.traceId, spanId: dropped.spanId },
      { traceId: kept.traceId, spanId: kept.spanId },
    ]);
  });

  it('sends OTLP protobuf by default', async () => {
    const collector = await receiver();
    const telemetry = await wire({ endpoint: collector.url });
    trace.getTracer('keel').startSpan('one').end();
    await telemetry.shutdown();
    expect(collector.requests).toHaveLength(1);
    expect(collector.requests[0]).toMatchObject({ path: '/v1/traces', contentType: 'application/x-protobuf' });
  });

  it('names the service from telemetry.serviceName, then OTEL_SERVICE_NAME', async () => {
    const collector = await receiver();
    const telemetry = await wire({ tracesEndpoint: `${collector.url}/v1/traces`, protocol: 'http/json' }, { OTEL_SERVICE_NAME: 'keel-eu', OTEL_RESOURCE_ATTRIBUTES: 'service.name=from-attributes' });
    trace.getTracer('keel').startSpan('one').end();
    await telemetry.shutdown();
    const [span] = await collector.waitFor((received) => received.length >= 1);
    expect(span!.resource['service.name']).toBe('keel-eu');
  });

  it('leaves libraries\' spans out and keeps a Keel span inside one parented to the Keel span around it', async () => {
    database = await createTestDatabase({ migrate: false });
    const collector = await receiver();
    const telemetry = await wire({ endpoint: collector.url, protocol: 'http/json' });
    const tracer = trace.getTracer('keel');
    await tracer.startActiveSpan('request', async (request) => {
      // slonik starts spans of its own (slonik.createConnection, slonik.executeQuery with the SQL).
      await database!.pool.transaction(async (transaction) => {
        await tracer.startActiveSpan('write', async (write) => {
          await transaction.query(sql.unsafe`SELECT 1`);
          write.end();
        });
      });
      trace.getTracer('some-library').startSpan('library work').end();
      request.end();
    });
    await telemetry.shutdown();
    const spans = await collector.waitFor((received) => received.length >= 2);
    expect(spans.map((span) => span.name).sort()).toEqual(['request', 'write']);
    const request = spans.find((span) => span.name === 'request')!;
    expect(spans.find((span) => span.name === 'write')!.parentSpanId).toBe(request.spanId);
  });

  it('writes trace_id and span_id on log lines inside a span, and nothing outside one or with tracing off', async () => {
    const traced = lineCollector();
    const logger = createLogger({ level: 'info' }, false, { traceContext: true, destination: traced.stream });
    const untraced = lineCollector();
    const plainLogger = createLogger({ level: 'info' }, false, { destination: untraced.stream });
    const tracer = trace.getTracer('keel');

    // No SDK wired: nothing, even inside a span.
    tracer.startActiveSpan('before', (span) => {
      logger.info('off');
      span.end();
    });
    const collector = await receiver();
    const telemetry = await wire({ endpoint: collector.url, protocol: 'http/json' });
    let ids: { traceId: string; spanId: string } | null = null;
    tracer.startActiveSpan('handling', (span) => {
      ids = span.spanContext();
      logger.info({ step: 1 }, 'inside');
      plainLogger.info('inside, plain logger');
      span.end();
    });
    logger.info('outside');
    await telemetry.shutdown();

    expect(traced.lines.map((line) => line.msg)).toEqual(['off', 'inside', 'outside']);
    const [off, inside, outside] = traced.lines;
    expect(off).not.toHaveProperty('trace_id');
    expect(inside).toMatchObject({ trace_id: ids!.traceId, span_id: ids!.spanId, step: 1 });
    expect(outside).not.toHaveProperty('trace_id');
    expect(outside).not.toHaveProperty('span_id');
    expect(untraced.lines).toHaveLength(1);
    expect(untraced.lines[0]).not.toHaveProperty('trace_id');
  });

  it('bounds the shutdown when the collector never answers', async () => {
    const hanging = createServer(() => undefined);
    await new Promise<void>((resolve) => hanging.listen(0, '127.0.0.1', resolve));
    const { port } = hanging.address() as AddressInfo;
    try {
      const telemetry = await wire({ endpoint: `http://127.0.0.1:${port}`, protocol: 'http/json', shutdownTimeoutMs: 300 });
      trace.getTracer('keel').startSpan('never exported').end();
      const started = Date.now();
      await telemetry.shutdown();
      expect(Date.now() - started).toBeLessThan(2_000);
      // A Keel started after it in this process can wire the SDK again.
      const collector = await receiver();
      const again = await wire({ endpoint: collector.url, protocol: 'http/json' });
      trace.getTracer('keel').startSpan('after').end();
      await again.shutdown();
      expect((await collector.waitFor((received) => received.length >= 1))[0]!.name).toBe('after');
    } finally {
      hanging.closeAllConnections();
      hanging.close();
    }
  });

  it('refuses a second SDK in the same process with a clear message', async () => {
    const collector = await receiver();
    await wire({ endpoint: collector.url, protocol: 'http/json' });
    const second = await startTelemetry(configSchema.parse({ telemetry: { endpoint: collector.url } }).telemetry, {}, identity, silentLogger());
    expect(second).toMatchObject({ ok: false, message: expect.stringMatching(/already registered in this process/) });
  });

  it('loads none of the SDK when tracing is off', async () => {
    const off = await startTelemetry(configSchema.parse({}).telemetry, { OTEL_SERVICE_NAME: 'x' }, identity, silentLogger());
    expect(off).toMatchObject({ ok: true, telemetry: { wired: false } });
    const disabled = await startTelemetry(configSchema.parse({ telemetry: { enabled: true } }).telemetry, { OTEL_SDK_DISABLED: 'true' }, identity, silentLogger());
    expect(disabled).toMatchObject({ ok: true, telemetry: { wired: false } });
    expect(tracingEnabled()).toBe(false);
  });
});
