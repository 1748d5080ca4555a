import type { FastifyInstance } from 'fastify';
import type { Registry } from 'prom-client';
import { registerMetrics } from '../metrics/keel-metrics.js';
import type { OperatorUiDeps } from './ui-routes.js';

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
    // Its modules (the pages, the statecharts' drawing, bull-board's dashboard) are loaded by the
    // roles that serve it, not by a worker's start.
    void http.register(async (scope) => (await import('./ui-routes.js')).operatorUiPlugin(scope, deps), { prefix: '/ui' });
  }
}
