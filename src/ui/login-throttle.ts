// Operator logins counted per source address in fixed windows (README, "The login under attack").
// A window opens at an address's first attempt and lasts `windowMs`; once `maxFailures`
// attempts in it have not succeeded the address is locked out until the window ends: every login
// from it, right token or wrong, answers 429 with Retry-After, so guessing cannot go on meanwhile.
// An attempt is counted when it is admitted, before its token is checked, so a burst of concurrent
// attempts cannot all slip in while the first ones are being checked; a success clears the count.
// The caller logs one line per window (when `failed` says it is the window's first failure). The
// counts live in this process's memory: each Keel process limits on its own.

export type LoginThrottleSettings = { maxFailures: number; windowMs: number; maxTrackedAddresses?: number };

type AddressWindow = { startedAt: number; attempts: number; logged: boolean };

/** Whether a login from an address may be tried now (admitted attempts are counted). */
export type LoginAdmission = { admitted: true } | { admitted: false; retryAfterSeconds: number };

/** What a failed attempt means for the log: whether it is the first failure of its window. */
export type LoginFailure = { firstInWindow: boolean; attempts: number };

const DEFAULT_MAX_TRACKED = 10_000;

export class LoginThrottle {
  private readonly windows = new Map<string, AddressWindow>();
  private readonly maxTracked: number;

  constructor(
    private readonly settings: LoginThrottleSettings,
    private readonly now: () => number = Date.now,
  ) {
    this.maxTracked = settings.maxTrackedAddresses ?? DEFAULT_MAX_TRACKED;
  }

  admit(address: string): LoginAdmission {
    const at = this.now();
    let window = this.windows.get(address);
    if (!window || at >= window.startedAt + this.settings.windowMs) {
      this.windows.delete(address);
      this.makeRoom(at);
      window = { startedAt: at, attempts: 0, logged: false };
      this.windows.set(address, window);
    }
    if (window.attempts >= this.settings.maxFailures) {
      return { admitted: false, retryAfterSeconds: Math.max(1, Math.ceil((window.startedAt + this.settings.windowMs - at) / 1000)) };
    }
    window.attempts += 1;
    return { admitted: true };
  }

  failed(address: string): LoginFailure {
    const window = this.windows.get(address);
    if (!window) return { firstInWindow: true, attempts: 1 };
    const firstInWindow = !window.logged;
    window.logged = true;
    return { firstInWindow, attempts: window.attempts };
  }

  /** A right token clears its address's count. */
  succeeded(address: string): void {
    this.windows.delete(address);
  }

  /** Bounded memory: ended windows go first, then the oldest (insertion order is start order). */
  private makeRoom(at: number): void {
    if (this.windows.size < this.maxTracked) return;
    for (const [address, window] of this.windows) if (at >= window.startedAt + this.settings.windowMs) this.windows.delete(address);
    while (this.windows.size >= this.maxTracked) this.windows.delete(this.windows.keys().next().value!);
  }
}
