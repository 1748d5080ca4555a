import { Gauge, Registry } from 'prom-client';
import type { BreakerState, PushDestinations } from '../push/destination-gate.js';

// Each push destination's circuit breaker and backlog in this process, read from the destination
// gate at scrape time (docs/push.md, "Isolation"). Per process: the breaker is kept in memory
// (docs/decisions/0055-push-isolation-per-process.md), so each process reports its own.

const BREAKER_STATES: readonly BreakerState[] = ['closed', 'half_open', 'open'];

export function pushDestinationMetrics(destinations: PushDestinations): Registry {
  const registry = new Registry();
  const registers = [registry];
  const views = () => destinations.gate?.view() ?? [];
  new Gauge({
    name: 'keel_push_destination_breaker',
    help: "Each push destination's (host:port) circuit breaker in this process: 1 for its current state, 0 for the others",
    labelNames: ['destination', 'state'],
    registers,
    collect() {
      this.reset();
      for (const view of views()) for (const state of BREAKER_STATES) this.set({ destination: view.destination, state }, view.breaker === state ? 1 : 0);
    },
  });
  new Gauge({
    name: 'keel_push_destination_backlog',
    help: 'Deliveries to each push destination deferred by this process (breaker open, or the destination, client or process at its share of the slots) and not sent since',
    labelNames: ['destination'],
    registers,
    collect() {
      this.reset();
      for (const view of views()) this.set({ destination: view.destination }, view.backlog);
    },
  });
  new Gauge({
    name: 'keel_push_destination_in_flight',
    help: 'Push attempts in flight to each destination in this process (at most its share of push.concurrency)',
    labelNames: ['destination'],
    registers,
    collect() {
      this.reset();
      for (const view of views()) this.set({ destination: view.destination }, view.inFlight);
    },
  });
  return registry;
}
