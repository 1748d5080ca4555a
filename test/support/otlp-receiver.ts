import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';

// A small OTLP/HTTP trace receiver (the collector's part): POST /v1/traces with the JSON encoding
// of ExportTraceServiceRequest (OTLP's http/json), decoded into flat spans. Only what the tests and
// the waterfall need is read; the rest of each span is ignored.

export type AttributeValue = string | number | boolean | null;

export type ReceivedSpan = {
  traceId: string;
  spanId: string;
  parentSpanId: string | null;
  name: string;
  /** OTLP's SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  kind: number;
  startNs: bigint;
  endNs: bigint;
  attributes: Record<string, AttributeValue>;
  resource: Record<string, AttributeValue>;
  scope: string;
  links: Array<{ traceId: string; spanId: string }>;
  statusCode: number;
};

const anyValue = z
  .object({
    stringValue: z.string().optional(),
    intValue: z.union([z.string(), z.number()]).optional(),
    doubleValue: z.number().optional(),
    boolValue: z.boolean().optional(),
  })
  .passthrough();
const keyValues = z.array(z.object({ key: z.string(), value: anyValue })).default([]);
const nanos = z.union([z.string(), z.number()]);
const exportRequest = z.object({
  resourceSpans: z
    .array(
      z.object({
        resource: z.object({ attributes: keyValues }).default({}),
        scopeSpans: z
          .array(
            z.object({
              scope: z.object({ name: z.string().default('') }).default({}),
              spans: z
                .array(
                  z.object({
                    traceId: z.string(),
                    spanId: z.string(),
                    parentSpanId: z.string().optional(),
                    name: z.string(),
                    kind: z.number().default(0),
                    startTimeUnixNano: nanos,
                    endTimeUnixNano: nanos,
                    attributes: keyValues,
                    links: z.array(z.object({ traceId: z.string(), spanId: z.string() })).default([]),
                    status: z.object({ code: z.number().default(0) }).default({}),
                  }),
                )
                .default([]),
            }),
          )
          .default([]),
      }),
    )
    .default([]),
});

function valueOf(value: z.infer<typeof anyValue>): AttributeValue {
  if (value.stringValue !== undefined) return value.stringValue;
  if (value.intValue !== undefined) return Number(value.intValue);
  if (value.doubleValue !== undefined) return value.doubleValue;
  if (value.boolValue !== undefined) return value.boolValue;
  return null;
}

const attributesOf = (list: z.infer<typeof keyValues>): Record<string, AttributeValue> => Object.fromEntries(list.map(({ key, value }) => [key, valueOf(value)]));

/** The spans of one OTLP/HTTP JSON export request. */
export function decodeOtlpJson(body: string): ReceivedSpan[] {
  const request = exportRequest.parse(JSON.parse(body));
  return request.resourceSpans.flatMap((resourceSpans) => {
    const resource = attributesOf(resourceSpans.resource.attributes);
    return resourceSpans.scopeSpans.flatMap((scopeSpans) =>
      scopeSpans.spans.map((span) => ({
        traceId: span.traceId,
        spanId: span.spanId,
        parentSpanId: span.parentSpanId ? span.parentSpanId : null,
        name: span.name,
        kind: span.kind,
        startNs: BigInt(span.startTimeUnixNano),
        endNs: BigInt(span.endTimeUnixNano),
        attributes: attributesOf(span.attributes),
        resource,
        scope: scopeSpans.scope.name,
        links: span.links.map((link) => ({ traceId: link.traceId, spanId: link.spanId })),
        statusCode: span.status.code,
      })),
    );
  });
}

export type OtlpReceiver = {
  /** The base endpoint (as OTEL_EXPORTER_OTLP_ENDPOINT): spans are POSTed to `${url}/v1/traces`. */
  url: string;
  spans: ReceivedSpan[];
  /** Every request received: path, content type and the headers' names and values (protobuf bodies are only counted here). */
  requests: Array<{ path: string; contentType: string; headers: Record<string, string | string[] | undefined> }>;
  /** Resolves with the spans received once `done` holds for them; rejects after timeoutMs. */
  waitFor: (done: (spans: ReceivedSpan[]) => boolean, timeoutMs?: number) => Promise<ReceivedSpan[]>;
  close: () => Promise<void>;
};

/** Starts a receiver on a free loopback port. A body it cannot decode is answered 400. */
export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const requests: OtlpReceiver['requests'] = [];
  const waiters = new Set<() => void>();
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const contentType = String(request.headers['content-type'] ?? '');
      requests.push({ path: request.url ?? '', contentType, headers: request.headers });
      if (request.method !== 'POST' || request.url !== '/v1/traces') {
        response.writeHead(404).end();
        return;
      }
      if (contentType.startsWith('application/x-protobuf')) {
        // Received and counted (requests), not decoded: an empty ExportTraceServiceResponse.
        response.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
        return;
      }
      if (!contentType.startsWith('application/json')) {
        response.writeHead(415).end();
        return;
      }
      try {
        spans.push(...decodeOtlpJson(Buffer.concat(chunks).toString('utf8')));
      } catch (error) {
        response.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ message: (error as Error).message }));
        return;
      }
      response.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      for (const wake of [...waiters]) wake();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    requests,
    waitFor: (done, timeoutMs = 20_000) =>
      new Promise((resolve, reject) => {
        if (done(spans)) {
          resolve(spans);
          return;
        }
        const check = () => {
          if (!done(spans)) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve(spans);
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`the spans awaited did not arrive within ${timeoutMs} ms; received: ${spans.map((span) => span.name).join(', ') || '(none)'}`));
        }, timeoutMs);
        waiters.add(check);
      }),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
