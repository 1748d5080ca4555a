import { Counter, Registry } from 'prom-client';
import { LIMIT_KINDS, type LimitKind } from '../limits/client-limits.js';

// Requests this process refused for a per-client limit (docs/reliability.md, "Per-client limits"),
// by the limit alone: a label per client would grow with the clients, and the log and the
// refused client's own 429s say who.

export class ClientLimitMetrics {
  readonly registry = new Registry();
  readonly #refusals: Counter<'limit'>;

  constructor() {
    this.#refusals = new Counter({
      name: 'keel_client_limit_refusals_total',
      help: 'Requests this process refused because their client was over a limit (429 / RESOURCE_EXHAUSTED), by limit: requestsPerSecond, concurrentRequests, openStreams, concurrentRuns',
      labelNames: ['limit'],
      registers: [this.registry],
    });
    // Every series from the start, so a rate over zero refusals reads 0, not "no data".
    for (const limit of LIMIT_KINDS) this.#refusals.inc({ limit }, 0);
  }

  refused(limit: LimitKind): void {
    this.#refusals.inc({ limit });
  }
}
