import type { FastifyInstance } from 'fastify';
import type { Registry } from 'prom-client';
import { registerMetrics } from '../metrics/keel-metrics.js';
import { operatorUiPlugin, type OperatorUiDeps } from './ui-routes.js';

// Everything an operator reaches over HTTP besides A2A: /metrics (every role) and the web UI with
// the queue dashboard under /ui (the API roles). One call from start-keel.

export type OperatorSurfaceDeps = OperatorUiDeps & {
  /** Serve the web UI (false for `--role worker`, which serves /metrics only). */
  ui: boolean;
  /** In-process metrics to render with /metrics (the hot path's). */
  inProcessMetrics?: readonly Registry[];
};

export function registerOperatorSurfaces(http: FastifyInstance, deps: OperatorSurfaceDeps): void {
  registerMetrics(http, { pool: deps.pool, queues: deps.queues, logger: deps.logger, token: deps.config.metrics.token, inProcess: deps.inProcessMetrics ?? [] });
  if (deps.ui) {
    void http.register(async (scope) => operatorUiPlugin(scope, deps), { prefix: '/ui' });
  }
}
