import { Gauge, Registry } from 'prom-client';

// This process's run slots kept free for clients (decision 0062), read at scrape time. The clients
// with waiting runs are read from Postgres with the rest of /metrics (src/metrics/keel-metrics.ts).

export function runSlotMetrics(keptFree: () => number): Registry {
  const registry = new Registry();
  new Gauge({
    name: 'keel_run_slots_kept_free',
    help: 'Run slots this process keeps free for clients seen in the last 2 s with no run in flight here (one each, at most a quarter of runs.concurrency), so their next task starts at once',
    registers: [registry],
    collect() {
      this.set(keptFree());
    },
  });
  return registry;
}
