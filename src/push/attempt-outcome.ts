import { describeRefusal, type GuardedFetchResult } from '../net/guarded-fetch.js';

// What one push attempt's result means, as a value: the outcome classes of docs/push.md. Pure (no
// I/O, no clock, no randomness): the worker records what this returns in one transaction
// (recordOutcome in delivery-repository.ts) and computes the backoff of a retry itself.

/** Statuses that are retried with backoff (besides any 3xx, which is never followed). */
const RETRY_STATUSES = new Set([429, 502, 503, 504]);

export type OutcomeClass =
  /** 2xx: the delivery is `delivered`. */
  | { class: 'delivered'; status: number }
  /** 429, 502, 503, 504, a 3xx, or no readable answer, with attempts left: retried with backoff. */
  | { class: 'retry'; status: number | null; errorClass: string | null; retryAfterHeader: string | undefined }
  /** Retryable but the attempts are used up, or any other status: the delivery is `dead`. */
  | { class: 'dead'; status: number | null; errorClass: string | null; attemptsUsed: boolean }
  /**
   * 401, 403: the config is paused. The delivery waits for the resume (pending), unless this was
   * its last attempt: then it is `dead` too, so a resume never sends it again.
   */
  | { class: 'paused'; status: number; lastAttempt: boolean }
  /** 404, 410, or the address guard refused the target: the config is stopped, its deliveries cancelled. */
  | { class: 'stopped'; status: number | null; errorClass: string | null; reason: string };

/** The outcome class of attempt `attempt` (1-based) of at most `maxAttempts`. */
export function classifyAttempt(result: GuardedFetchResult, attempt: number, maxAttempts: number): OutcomeClass {
  const attemptsLeft = attempt < maxAttempts;
  if (!result.ok && result.kind === 'refused') {
    return { class: 'stopped', status: null, errorClass: `refused:${result.refusal.reason}`, reason: `address guard: ${describeRefusal(result.refusal)}` };
  }
  if (!result.ok) {
    // Timeout, connection error, an answer over the size limit or not valid HTTP: nothing acknowledged.
    const errorClass = result.failure.class;
    return attemptsLeft
      ? { class: 'retry', status: null, errorClass, retryAfterHeader: undefined }
      : { class: 'dead', status: null, errorClass, attemptsUsed: true };
  }
  const status = result.response.status;
  if (status >= 200 && status < 300) return { class: 'delivered', status };
  if (status === 401 || status === 403) return { class: 'paused', status, lastAttempt: !attemptsLeft };
  if (status === 404 || status === 410) return { class: 'stopped', status, errorClass: null, reason: `receiver answered ${status}` };
  if (RETRY_STATUSES.has(status) || (status >= 300 && status < 400)) {
    if (!attemptsLeft) return { class: 'dead', status, errorClass: null, attemptsUsed: true };
    const retryAfterHeader = status === 429 || status === 503 ? result.response.headers['retry-after'] : undefined;
    return { class: 'retry', status, errorClass: null, retryAfterHeader };
  }
  return { class: 'dead', status, errorClass: null, attemptsUsed: false };
}
