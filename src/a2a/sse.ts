import type { FastifyReply, FastifyRequest } from 'fastify';

// Server-Sent Events on a hijacked reply: every event carries `id: <journal sequence>` so a client
// can resume with Last-Event-ID. A comment line keeps idle connections from timing out.

export type SseWriter = { send: (id: number, data: unknown) => boolean; close: () => void; signal: AbortSignal };

export function openSse(request: FastifyRequest, reply: FastifyReply, headers: Record<string, string> = {}): SseWriter {
  reply.hijack();
  const raw = reply.raw;
  raw.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
    ...headers,
  });
  raw.flushHeaders?.();
  const abort = new AbortController();
  const keepAlive = setInterval(() => raw.write(': keep-alive\n\n'), 15_000);
  keepAlive.unref();
  const done = () => {
    clearInterval(keepAlive);
    abort.abort();
  };
  request.raw.on('close', done);
  raw.on('close', done);
  return {
    signal: abort.signal,
    send: (id, data) => {
      if (abort.signal.aborted) return false;
      return raw.write(`id: ${id}\ndata: ${JSON.stringify(data)}\n\n`);
    },
    close: () => {
      done();
      raw.end();
    },
  };
}

export function lastEventId(request: FastifyRequest): number | undefined {
  const header = request.headers['last-event-id'];
  const value = Array.isArray(header) ? header[0] : header;
  if (value === undefined || !/^\d{1,9}$/.test(value.trim())) return undefined;
  return Number(value.trim());
}
