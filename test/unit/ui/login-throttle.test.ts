import { describe, expect, it } from 'vitest';
import { LoginThrottle } from '../../../src/ui/login-throttle.js';

// The login throttle's arithmetic on a test clock: attempts count when admitted, the lockout lasts
// until the window opened by the first attempt ends, Retry-After is the rest of that window, a
// success clears the count, one failure per window is marked for the log, and memory is bounded.

function throttle(maxFailures = 3, windowMs = 10_000, maxTrackedAddresses?: number) {
  let now = 1_000_000;
  const subject = new LoginThrottle({ maxFailures, windowMs, ...(maxTrackedAddresses ? { maxTrackedAddresses } : {}) }, () => now);
  return { subject, advance: (ms: number) => (now += ms) };
}

describe('LoginThrottle', () => {
  it('admits maxFailures attempts per window, then refuses with the rest of the window', () => {
    const { subject, advance } = throttle();
    for (let i = 0; i < 3; i++) expect(subject.admit('a')).toEqual({ admitted: true });
    expect(subject.admit('a')).toEqual({ admitted: false, retryAfterSeconds: 10 });
    advance(7_500);
    expect(subject.admit('a')).toEqual({ admitted: false, retryAfterSeconds: 3 });
    expect(subject.admit('b')).toEqual({ admitted: true });
    advance(2_500);
    expect(subject.admit('a')).toEqual({ admitted: true });
  });

  it('marks only the first failure of a window for the log', () => {
    const { subject, advance } = throttle();
    subject.admit('a');
    expect(subject.failed('a').firstInWindow).toBe(true);
    subject.admit('a');
    expect(subject.failed('a').firstInWindow).toBe(false);
    advance(10_000);
    subject.admit('a');
    expect(subject.failed('a').firstInWindow).toBe(true);
  });

  it('a success clears the count', () => {
    const { subject } = throttle();
    subject.admit('a');
    subject.failed('a');
    subject.admit('a');
    subject.failed('a');
    subject.admit('a');
    subject.succeeded('a');
    for (let i = 0; i < 3; i++) expect(subject.admit('a').admitted).toBe(true);
  });

  it('keeps at most maxTrackedAddresses windows, dropping the oldest', () => {
    const { subject } = throttle(1, 10_000, 2);
    subject.admit('a');
    subject.admit('b');
    subject.admit('c');
    // a was dropped: it starts afresh; c is still locked.
    expect(subject.admit('a').admitted).toBe(true);
    expect(subject.admit('c').admitted).toBe(false);
  });
});
