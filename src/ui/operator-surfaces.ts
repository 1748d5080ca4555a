import type { FastifyInstance } from 'fastify';
import type { Registry } from 'prom-client';
import type { DatabasePool } from 'slonik';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { KeelConfig } from '../config/load-config.js';
import type { KeelLogger } from '../log/logger.js';
import { registerMetrics } from '../metrics/keel-metrics.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import type { Sealer } from '../sealing/sealer.js';
import { operatorUiPlugin } from './ui-routes.js';

// Everything an operator reaches over HTTP besides A2A: /metrics (every role) and the web UI with
// the queue dashboard under /ui (the API roles). One call from start-keel.

export type OperatorSurfaceDeps = {
  pool: DatabasePool;
  sealer: Sealer;
  queues: KeelQueues;
  config: KeelConfig;
  logger: KeelLogger;
  /** The agents: the UI draws the statechart agents' machines. */
  registry?: Pick<AgentRegistry, 'agents'>;
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
