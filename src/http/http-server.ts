import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Probe } from '../health/probe.js';
import type { KeelLogger } from '../log/logger.js';

/** Each probe answers within its own deadline, so /readyz answers even when a dependency does not. */
export type ReadinessCheck = () => Promise<{ database: Probe; queue: Probe }>;

export type HttpServerOptions = {
  logger: KeelLogger;
  bodyLimitBytes: number;
  readiness: ReadinessCheck;
};

/**
 * The Fastify server of a Keel process. `/healthz` says the process is alive; `/readyz` says it can
 * do work now: 200 only when both the database and the queue backend answer, else 503 with the
 * reason of each failing probe.
 */
export function buildHttpServer(options: HttpServerOptions): FastifyInstance {
  const app = Fastify({
    loggerInstance: options.logger.child({ component: 'http' }) as unknown as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: options.bodyLimitBytes,
    return503OnClosing: true,
    // At shutdown idle keep-alive connections are closed at once; streams end on their own.
    forceCloseConnections: 'idle',
  });

  app.get('/healthz', async () => ({ status: 'ok' }));

  app.get('/readyz', async (_request, reply) => {
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
