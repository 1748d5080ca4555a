import { describe, expect, it } from 'vitest';
import type { GuardedFailureClass, GuardedFetchResult } from '../../../src/net/guarded-fetch.js';
import { classifyAttempt } from '../../../src/push/attempt-outcome.js';

// The outcome classes of docs/push.md ("Outcome classes"), one by one: what an attempt's result
// means for the delivery and its config, on a middle attempt and on the last one (8 of 8).

const answered = (status: number, headers: Record<string, string> = {}): GuardedFetchResult => ({
  ok: true,
  response: { status, headers, body: Buffer.alloc(0), durationMs: 5, address: '127.0.0.1' },
});
const failed = (cls: GuardedFailureClass): GuardedFetchResult => ({ ok: false, kind: 'failed', failure: { class: cls, message: cls, durationMs: 5 } });
const refused: GuardedFetchResult = {
  ok: false,
  kind: 'refused',
  refusal: { reason: 'refused_range', host: 'hooks.example', address: '10.0.0.1', range: '10.0.0.0/8', detail: 'private' },
};

describe('classifyAttempt', () => {
  it('2xx: delivered, on any attempt', () => {
    for (const status of [200, 201, 202, 204, 299]) {
      expect(classifyAttempt(answered(status), 1, 8)).toEqual({ class: 'delivered', status });
      expect(classifyAttempt(answered(status), 8, 8)).toEqual({ class: 'delivered', status });
    }
  });

  it('429, 502, 503, 504 and any 3xx (not followed): retried while attempts are left, dead on the last', () => {
    for (const status of [429, 502, 503, 504, 300, 301, 302, 303, 307, 308]) {
      expect(classifyAttempt(answered(status), 3, 8)).toEqual({ class: 'retry', status, errorClass: null, retryAfterHeader: undefined });
      expect(classifyAttempt(answered(status), 8, 8)).toEqual({ class: 'dead', status, errorClass: null, attemptsUsed: true });
    }
  });

  it('Retry-After is taken from 429 and 503 only', () => {
    expect(classifyAttempt(answered(429, { 'retry-after': '3' }), 1, 8)).toMatchObject({ class: 'retry', retryAfterHeader: '3' });
    expect(classifyAttempt(answered(503, { 'retry-after': 'Sat, 05 Dec 2026 04:00:00 GMT' }), 1, 8)).toMatchObject({
      retryAfterHeader: 'Sat, 05 Dec 2026 04:00:00 GMT',
    });
    expect(classifyAttempt(answered(502, { 'retry-after': '3' }), 1, 8)).toMatchObject({ class: 'retry', retryAfterHeader: undefined });
  });

  it('a timeout, a connection error or an unreadable answer: retried while attempts are left, dead on the last', () => {
    for (const errorClass of ['timeout', 'connection', 'aborted', 'too_large', 'protocol'] as const) {
      expect(classifyAttempt(failed(errorClass), 1, 8)).toEqual({ class: 'retry', status: null, errorClass, retryAfterHeader: undefined });
      expect(classifyAttempt(failed(errorClass), 8, 8)).toEqual({ class: 'dead', status: null, errorClass, attemptsUsed: true });
    }
  });

  it('401, 403: the config pauses; on the last attempt the delivery is over too', () => {
    for (const status of [401, 403]) {
      expect(classifyAttempt(answered(status), 1, 8)).toEqual({ class: 'paused', status, lastAttempt: false });
      expect(classifyAttempt(answered(status), 8, 8)).toEqual({ class: 'paused', status, lastAttempt: true });
      expect(classifyAttempt(answered(status), 1, 1)).toEqual({ class: 'paused', status, lastAttempt: true });
    }
  });

  it('404, 410: the config stops, on any attempt', () => {
    for (const status of [404, 410]) {
      for (const attempt of [1, 8]) {
        expect(classifyAttempt(answered(status), attempt, 8)).toEqual({ class: 'stopped', status, errorClass: null, reason: `receiver answered ${status}` });
      }
    }
  });

  it('refused by the address guard at delivery time: the config stops, naming the refusal', () => {
    expect(classifyAttempt(refused, 2, 8)).toEqual({
      class: 'stopped',
      status: null,
      errorClass: 'refused:refused_range',
      reason: 'address guard: The address guard refused host hooks.example: address 10.0.0.1 is in the refused range 10.0.0.0/8.',
    });
  });

  it('any other status (400, 422, 500, ...): dead at once, on any attempt', () => {
    for (const status of [400, 402, 405, 409, 413, 422, 500, 501, 505, 599]) {
      expect(classifyAttempt(answered(status), 1, 8)).toEqual({ class: 'dead', status, errorClass: null, attemptsUsed: false });
    }
  });
});
