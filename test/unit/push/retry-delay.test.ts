import { describe, expect, it } from 'vitest';
import { retryDelayMs } from '../../../workers/push-delivery.js';

// The backoff before retry n (docs/push.md, "Outcome classes"): min(retryBase × 2^(n−1),
// retryMax) with jitter in its upper half, so every delay lies within [half, whole] of that
// exponential step, and delays are spread (not all equal) so that configs failing together do not
// retry together. Retry-After raises the delay up to the ceiling, never past it.

const options = { timeoutMs: 15_000, connectTimeoutMs: 5_000, maxAttempts: 8, retryBaseMs: 2000, retryMaxMs: 300_000, destinationSlots: 4, breakerFailures: 5, breakerCooldownMs: 30_000 };
const SAMPLES = 2000;

const samples = (attempt: number, retryAfterMs?: number) => Array.from({ length: SAMPLES }, () => retryDelayMs(options, attempt, retryAfterMs));

describe('retryDelayMs', () => {
  it.each([1, 2, 3, 4, 5, 6, 7, 8, 9, 12])('retry after attempt %s: within [step/2, step] for step = min(base × 2^(n−1), max)', (attempt) => {
    const step = Math.min(options.retryMaxMs, options.retryBaseMs * 2 ** (attempt - 1));
    for (const delay of samples(attempt)) {
      expect(delay).toBeGreaterThanOrEqual(step / 2);
      expect(delay).toBeLessThanOrEqual(step);
    }
  });

  it.each([1, 4, 8])('retry after attempt %s: delays are spread over the upper half, not all equal', (attempt) => {
    const step = Math.min(options.retryMaxMs, options.retryBaseMs * 2 ** (attempt - 1));
    const delays = samples(attempt);
    expect(new Set(delays).size).toBeGreaterThan(SAMPLES * 0.9);
    // Each quarter of the jitter range [step/2, step] gets its share (2000 samples: ~500 each;
    // below 300 has a probability far under 1e-20).
    const quarters = [0, 0, 0, 0];
    for (const delay of delays) quarters[Math.min(3, Math.floor(((delay - step / 2) / (step / 2)) * 4))]! += 1;
    for (const count of quarters) expect(count).toBeGreaterThan(300);
  });

  it('never exceeds retryMaxSeconds, however many attempts', () => {
    for (const delay of samples(40)) {
      expect(delay).toBeGreaterThanOrEqual(options.retryMaxMs / 2);
      expect(delay).toBeLessThanOrEqual(options.retryMaxMs);
    }
  });

  it('waits at least Retry-After, capped by retryMaxSeconds', () => {
    for (const delay of samples(1, 60_000)) expect(delay).toBe(60_000);
    for (const delay of samples(1, 3_600_000)) expect(delay).toBe(options.retryMaxMs);
    // A Retry-After shorter than the backoff leaves the jittered backoff as it is.
    for (const delay of samples(6, 1000)) {
      expect(delay).toBeGreaterThanOrEqual(32_000);
      expect(delay).toBeLessThanOrEqual(64_000);
    }
  });
});
