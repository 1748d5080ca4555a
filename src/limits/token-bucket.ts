// A token bucket, the requests-per-second limit's core: it holds at most `burst` tokens, refills at
// `ratePerSecond` and a request takes one. Time is passed in (milliseconds), so the bucket is pure
// arithmetic over the calls it gets and a test drives it with a clock of its own.

export type BucketTake = { ok: true } | { ok: false; waitSeconds: number };

export class TokenBucket {
  #tokens: number;
  #at: number;

  constructor(
    readonly ratePerSecond: number,
    readonly burst: number,
    now: number,
  ) {
    this.#tokens = burst;
    this.#at = now;
  }

  #refill(now: number): void {
    if (now > this.#at) {
      this.#tokens = Math.min(this.burst, this.#tokens + ((now - this.#at) / 1000) * this.ratePerSecond);
      this.#at = now;
    }
  }

  /** Takes one token, or says how long until one is there (nothing is taken then). */
  take(now: number): BucketTake {
    this.#refill(now);
    if (this.#tokens >= 1) {
      this.#tokens -= 1;
      return { ok: true };
    }
    return { ok: false, waitSeconds: (1 - this.#tokens) / this.ratePerSecond };
  }

  /** Whether the bucket is full again (its state then says nothing a new bucket would not). */
  full(now: number): boolean {
    this.#refill(now);
    return this.#tokens >= this.burst;
  }
}
