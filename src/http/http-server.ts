import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { KeelLogger } from '../log/logger.js';

export type ReadinessCheck = () => Promise<{ database: boolean; queue: boolean }>;

export type HttpServerOptions = {
  logger: KeelLogger;
  bodyLimitBytes: number;
  readiness: ReadinessCheck;
};

/**
 * The Fastify server of a Keel process. `/healthz` says the process is alive; `/readyz` says it can
 * do work now: 200 only when both the database and the queue backend answer.
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
    const ready = checks.database && checks.queue;
    return reply.code(ready ? 200 : 503).send({
      status: ready ? 'ready' : 'not_ready',
      database: checks.database ? 'ok' : 'unavailable',
      queue: checks.queue ? 'ok' : 'unavailable',
    });
  });

  return app;
}
