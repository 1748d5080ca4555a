import type { LimitKind, LimitRefusal } from '../limits/client-limits.js';
import { A2AErrors, type A2AError } from './a2a-error.js';

// The A2A error of a per-client limit's refusal (docs/reliability.md, "Per-client limits";
// decision 0060): CLIENT_LIMIT_EXCEEDED, 429, RESOURCE_EXHAUSTED.

const perSecond = (rate: number) => String(Number(rate.toPrecision(3)));

/** The A2A error of a refusal: the limit by name, its value, the wait (message, ErrorInfo metadata, RetryInfo). */
export function limitExceeded({ kind, limits, retryAfterSeconds }: LimitRefusal): A2AError {
  const value = limits[kind];
  const what: Record<LimitKind, string> = {
    requestsPerSecond: `at most ${perSecond(limits.requestsPerSecond)} requests per second (burst ${limits.burst})`,
    concurrentRequests: `at most ${value} requests in flight at once`,
    openStreams: `at most ${value} open streams at once`,
    concurrentRuns: `at most ${value} tasks not yet in a terminal state`,
  };
  return A2AErrors.clientLimitExceeded(`client limit ${kind} reached: ${what[kind]}; retry after ${retryAfterSeconds} s`, {
    metadata: {
      limit: kind,
      limitValue: String(value),
      ...(kind === 'requestsPerSecond' ? { burst: String(limits.burst) } : {}),
      retryAfterSeconds: String(retryAfterSeconds),
    },
    retryAfterSeconds,
  });
}

