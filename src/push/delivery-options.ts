import type { KeelConfig } from '../config/load-config.js';

// The push worker's timings. They come from the `push` section of the config, whose keys are
// bounded as the A2A specification and docs/push.md require (timeout 10-30 s, at most 8 attempts).
// Keel's own test suites need sub-second timeouts and, in a fault scenario, more attempts; they
// hand them to `startKeel` as an argument (`StartOptions.pushTestTimings`), which no configuration
// file, environment variable or `keel` command line can reach: only the test harness's own
// starters pass it (docs/decisions/0052-push-attempts-capped-and-test-timings-by-the-harness.md).
// When given, each is logged as a warning at start.

export type DeliveryOptions = {
  timeoutMs: number;
  /** The connection's own deadline (at most timeoutMs, which bounds the whole attempt). */
  connectTimeoutMs: number;
  maxAttempts: number;
  retryBaseMs: number;
  retryMaxMs: number;
  /** The most attempts in flight to one destination (host and port): its share of push.concurrency, at least 1. */
  destinationSlots: number;
  breakerFailures: number;
  breakerCooldownMs: number;
};

/** Timings only the test harness passes to startKeel, beyond the configuration's bounds. */
export type PushTestTimings = { timeoutSeconds?: number; maxAttempts?: number };

export type DeliveryOptionsResult = { options: DeliveryOptions; warnings: string[] };

/** The delivery options of the config, with the test harness's timings (if any) applied. */
export function deliveryOptionsFor(push: KeelConfig['push'], testTimings: PushTestTimings = {}): DeliveryOptionsResult {
  const options: DeliveryOptions = {
    timeoutMs: push.timeoutSeconds * 1000,
    maxAttempts: push.maxAttempts,
    retryBaseMs: push.retryBaseSeconds * 1000,
    retryMaxMs: push.retryMaxSeconds * 1000,
    connectTimeoutMs: push.connectTimeoutSeconds * 1000,
    destinationSlots: Math.max(1, Math.floor(push.concurrency * push.destinationShare)),
    breakerFailures: push.breakerFailures,
    breakerCooldownMs: push.breakerCooldownSeconds * 1000,
  };
  const warnings: string[] = [];
  const timeout = testTimings.timeoutSeconds;
  if (timeout !== undefined) {
    if (Number.isFinite(timeout) && timeout > 0 && timeout <= 300) {
      options.timeoutMs = timeout * 1000;
      warnings.push(`test push timeout of ${timeout} s in effect, not push.timeoutSeconds`);
    } else {
      warnings.push(`test push timeout ${String(timeout)} ignored: expected seconds above 0 and at most 300`);
    }
  }
  const attempts = testTimings.maxAttempts;
  if (attempts !== undefined) {
    if (Number.isInteger(attempts) && attempts >= 1 && attempts <= 100) {
      options.maxAttempts = attempts;
      warnings.push(`test push attempt limit of ${attempts} in effect, not push.maxAttempts`);
    } else {
      warnings.push(`test push attempt limit ${String(attempts)} ignored: expected a whole number from 1 to 100`);
    }
  }
  options.connectTimeoutMs = Math.min(options.connectTimeoutMs, options.timeoutMs);
  return { options, warnings };
}
