import { describe, it } from 'vitest';
import { BACKEND } from './support/installation.js';
import { startLoad } from './support/load.js';
import type { ReceiverAction } from './support/peers.js';
import { expectClean, expectedEcho, finishScenario, SCENARIO_TIMEOUT_MS } from './support/scenario.js';
import { useFaultSuite } from './support/suite.js';

// Fault scenario: a push receiver that fails at random. Of its answers 20 % are connection resets
// (the socket destroyed before any answer), 20 % are 503, 10 % are slow beyond Keel's push timeout
// (1.5 s against 1 s: Keel gives up waiting while the receiver may still answer 200) and 10 % are
// slow within it; the rest answer 200 at once. 240 tasks on one `all` process, each with a push
// config: every journal event must still be acknowledged at least once, in journal order per
// config. Attempts per delivery are raised to 30 (default and maximum of push.maxAttempts: 8, so
// through the harness's test-only push timings, which only a test's start can pass) so that a delivery's run of bad luck
// (0.5^8 ≈ 0.4 % per delivery, over ~700 deliveries) does not end it as dead.

const flaky = (): ReceiverAction => {
  const roll = Math.random();
  if (roll < 0.2) return { kind: 'reset' };
  if (roll < 0.4) return { kind: 'status', status: 503 };
  if (roll < 0.5) return { kind: 'ok', delayMs: 1500 };
  if (roll < 0.6) return { kind: 'ok', delayMs: 300 + Math.random() * 400 };
  return { kind: 'ok' };
};

const suite = useFaultSuite({ receiver: flaky, model: { minDelayMs: 50, maxDelayMs: 150 } });

describe(`a randomly failing push receiver on the ${BACKEND} queue backend`, () => {
  it(
    'resets, 503s and slow answers: every event arrives, in order per config',
    async () => {
      const { receiver } = suite;
      // The suite's whole-pool destination share and 1 s breaker cooldown (installation.ts): with
      // the default 30 s cooldown every opening of this receiver's breaker held all deliveries for
      // 30 s, and one CI run ended its wait with 123 still pending; with a quarter of the slots
      // and a 1 s cooldown it drained in 77 s, with the whole pool in 33 s.
      // Retries at most 0.25 s apart (the suite's 1 s): a delivery's run of failures, nine or ten
      // in a row somewhere among 720, waited out its backoff while the rest were done; the drain
      // after the clients settled took 15-18 s and takes 10-11 s (the backoff's doubling has its own tests).
      const installation = await suite.install({ env: { KEEL_PUSH_CONCURRENCY: '32', KEEL_PUSH_RETRY_MAX_SECONDS: '0.25' }, pushTestTimings: { maxAttempts: 30 } });
      await installation.addNode('all');
      const startedAt = Date.now();
      const load = startLoad({ apis: () => installation.apiUrls(), token: installation.token, count: 240, ratePerSecond: 40, maxInFlight: 60, pushUrl: receiver.url, expected: expectedEcho });
      const counts = await finishScenario({
        scenario: 'flaky-receiver',
        installation,
        load,
        startedAt,
        receiver,
        faults: () => ({
          receiverRequests: receiver.receipts.length,
          receiverResets: receiver.receipts.filter((receipt) => receipt.action === 'reset').length,
          receiver503s: receiver.receipts.filter((receipt) => receipt.action === 'status').length,
        }),
      });
      expectClean(counts, installation);
    },
    SCENARIO_TIMEOUT_MS,
  );
});
