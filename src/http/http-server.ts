import { maxHeaderSize, STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from 'fastify';
import type { Probe } from '../health/probe.js';
import type { KeelLogger } from '../log/logger.js';

/** Each probe answers within its own deadline, so /readyz answers even when a dependency does not. */
export type ReadinessCheck = () => Promise<{ database: Probe; queue: Probe }>;

export type HttpServerOptions = {
  logger: KeelLogger;
  bodyLimitBytes: number;
  readiness: ReadinessCheck;
  /**
   * Liveness (/livez, and /healthz before it): the event loop's current lag and the bound beyond
   * which the process counts as stalled. Read from a timer, never from the database or the queue.
   */
  liveness: { lagMs: () => number; maxLagMs: number };
  /** True once a graceful shutdown began: /readyz answers 503 "shutting down" without probing. */
  shuttingDown?: () => boolean;
  /**
   * The body of a request refused before routing (bad percent-encoding 400, an over-long path
   * parameter 414, oversized headers 431, a request Node cannot parse 400, a request timeout 408);
   * method and url are null when the request line was not read. By default a plain JSON error.
   */
  refusedRequestAnswer?: RefusedRequestAnswer;
};

export type RefusedRequestAnswer = (method: string | null, url: string | null, status: number, message: string) => { status: number; contentType: string; body: string };

/** The longest path parameter the router accepts (Fastify's default): a longer one is 414. */
export const MAX_PARAM_LENGTH = 100;

const plainJsonAnswer: RefusedRequestAnswer = (_method, _url, status, message) => ({ status, contentType: 'application/json', body: JSON.stringify({ error: message, statusCode: status }) });

/**
 * The method and target at the start of the bytes Node's parser refused, if they are there (the
 * chunk being parsed: a request written at once starts it). A target too long to end within them is
 * cut: its start still says which binding it was addressed to.
 */
function requestLineOf(raw: unknown): { method: string; url: string } | null {
  if (!Buffer.isBuffer(raw)) return null;
  const match = /^([A-Z]{1,16}) (\/[\x21-\x7e]*)/.exec(raw.subarray(0, 8192).toString('latin1'));
  return match ? { method: match[1]!, url: match[2]! } : null;
}

/**
 * The Fastify server of a Keel process. `/livez` (and its older name `/healthz`) says the process is
 * alive: its event loop turns within the bound; `/readyz` says it can do work now: 200 only when
 * both the database and the queue backend answer, else 503 with the reason of each failing probe,
 * and 503 "shutting down" from the start of a graceful shutdown.
 */
export function buildHttpServer(options: HttpServerOptions): FastifyInstance {
  const refusedAnswer = options.refusedRequestAnswer ?? plainJsonAnswer;
  const app = Fastify({
    loggerInstance: options.logger.child({ component: 'http' }) as unknown as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: options.bodyLimitBytes,
    return503OnClosing: true,
    // At shutdown idle keep-alive connections are closed at once; streams end on their own.
    forceCloseConnections: 'idle',
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    // Refusals Fastify makes before routing go out in the shape of the binding addressed (or plain
    // JSON), never Fastify's own body.
    frameworkErrors: (error, request, reply) => {
      const status = error.code === 'FST_ERR_BAD_URL' ? 400 : error.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 414 : (error.statusCode ?? 400);
      const message =
        status === 400 && error.code === 'FST_ERR_BAD_URL'
          ? 'the URL is not validly percent-encoded'
          : status === 414
            ? `a path segment is longer than ${MAX_PARAM_LENGTH} characters`
            : error.message;
      const answer = refusedAnswer(request.method, request.url, status, message);
      void (reply as unknown as FastifyReply).code(answer.status).type(answer.contentType).send(answer.body);
    },
    // Oversized headers and unparseable requests are refused by Node's parser, before Fastify sees
    // a request: the answer is written on the socket, which then closes.
    clientErrorHandler: (error: Error & { code?: string; rawPacket?: unknown }, socket: Socket) => {
      if (error.code === 'ECONNRESET' || socket.destroyed) return;
      const [status, message] =
        error.code === 'HPE_HEADER_OVERFLOW'
          ? [431, `the request's headers are larger than ${maxHeaderSize} bytes`]
          : error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
            ? [408, 'the request did not arrive in time']
            : [400, 'the request could not be parsed'];
      const line = requestLineOf(error.rawPacket);
      const answer = refusedAnswer(line?.method ?? null, line?.url ?? null, status, message);
      if (socket.writable) {
        socket.write(
          `HTTP/1.1 ${answer.status} ${STATUS_CODES[answer.status] ?? ''}\r\nContent-Type: ${answer.contentType}\r\nContent-Length: ${Buffer.byteLength(answer.body)}\r\nConnection: close\r\n\r\n${answer.body}`,
        );
      }
      socket.destroy(error);
    },
  });

  const live = async (_request: unknown, reply: FastifyReply) => {
    const lagMs = options.liveness.lagMs();
    if (lagMs > options.liveness.maxLagMs) return reply.code(503).send({ status: 'stalled', eventLoopLagMs: lagMs, maxLagMs: options.liveness.maxLagMs });
    return reply.code(200).send({ status: 'ok' });
  };
  app.get('/livez', live);
  app.get('/healthz', live);

  app.get('/readyz', async (_request, reply) => {
    if (options.shuttingDown?.()) return reply.code(503).send({ status: 'not_ready', reasons: { server: 'shutting down' } });
    const checks = await options.readiness();
    const ready = checks.database.ok && checks.queue.ok;
    const reasons: Record<string, string> = {};
    if (!checks.database.ok) reasons.database = checks.database.reason;
    if (!checks.queue.ok) reasons.queue = checks.queue.reason;
    return reply.code(ready ? 200 : 503).send({
      status: ready ? 'ready' : 'not_ready',
      database: checks.database.ok ? 'ok' : 'unavailable',
      queue: checks.queue.ok ? 'ok' : 'unavailable',
      ...(ready ? {} : { reasons }),
    });
  });

  return app;
}
