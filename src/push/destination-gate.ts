// Push isolation within one process (docs/push.md, "Isolation"; decision 0055). Every attempt asks
// the gate for one of the `slots` delivery slots before it is counted (the push queue's worker
// runs twice as many jobs, so jobs that are only deferred never wait behind held slots). The gate
// answers from memory, without I/O:
// - a destination (host and port) holds at most `destinationSlots` attempts in flight, so a hung
//   receiver ties up that many of the push worker's slots, never all of them;
// - an owning client holds at most its fair share of the slots, `(slots - reserve) / clients with
//   work` rounded down (at least one; a client has work while its deliveries could be sent, not
//   while they wait for an open breaker). The reserve (`slots / 8`, at least one: 2 of 16) is kept
//   free of the clients with work, so a client that had none finds a slot at once: its head
//   delivery never waits for another client's backlog, not even for one of its requests to end;
// - a destination's circuit breaker opens after `breakerFailures` consecutive timeouts or
//   connection failures; while open, nothing is sent there; after `breakerCooldownMs` one attempt
//   probes it (half-open), and its success closes the breaker, its failure opens it again.
// A refused attempt is deferred: its job ends at once (the slot is free) and comes back later. It
// was never counted, so it does not use one of push.maxAttempts: no request was sent.

export type BreakerState = 'closed' | 'open' | 'half_open';

export type GateOptions = {
  /** The push worker's slots (push.concurrency). */
  slots: number;
  /** The most attempts in flight to one destination. */
  destinationSlots: number;
  breakerFailures: number;
  breakerCooldownMs: number;
  /** The longest an attempt can take (push.timeoutSeconds): the most a probe keeps the others waiting. */
  attemptTimeoutMs: number;
};

export type GateAnswer =
  | { kind: 'granted'; probe: boolean; release: (outcome: 'success' | 'failure' | 'neutral') => void }
  | { kind: 'deferred'; reason: 'breaker_open' | 'probing' | 'slots_full' | 'destination_full' | 'client_share'; retryInMs: number };

type Destination = {
  inFlight: number;
  breaker: BreakerState;
  consecutiveFailures: number;
  openedAt: number;
  /** When the current probe was sent (half-open). */
  probeAt: number;
  /** Deliveries deferred here and not granted since (the destination's backlog in this process). */
  waiting: Set<string>;
  lastSeen: number;
};

export type DestinationView = { destination: string; breaker: BreakerState; inFlight: number; backlog: number; consecutiveFailures: number };

/** How long an owner counts as having work after its last delivery was seen (granted or deferred). */
const OWNER_ACTIVE_MS = 2_000;
/** A destination with nothing in flight, nothing waiting and a closed breaker is forgotten after this. */
const DESTINATION_IDLE_MS = 10 * 60_000;

/** `host:port` of a URL (the scheme's default port when none is written); the URL itself if unparsable. */
export function destinationOf(url: string): string {
  try {
    const parsed = new URL(url);
    const port = parsed.port || (parsed.protocol === 'https:' ? '443' : '80');
    return `${parsed.hostname}:${port}`;
  } catch {
    return url;
  }
}

/** The slots kept free of the clients with work, for a client that has none yet: an eighth, at least one. */
export const reserveOf = (slots: number) => Math.max(1, Math.floor(slots / 8));

const jitter = (ms: number) => ms + Math.floor(Math.random() * Math.max(1, ms / 2));

export class DestinationGate {
  readonly #options: GateOptions;
  readonly #destinations = new Map<string, Destination>();
  readonly #owners = new Map<string, { inFlight: number; lastSeen: number }>();
  readonly #now: () => number;
  #inFlight = 0;

  constructor(options: GateOptions, now: () => number = Date.now) {
    this.#options = options;
    this.#now = now;
  }

  /** Asks for a slot for delivery `deliveryId` of `owner` to `destination`. */
  acquire(destination: string, owner: string, deliveryId: string): GateAnswer {
    const now = this.#now();
    const place = this.#destination(destination, now);
    if (place.breaker === 'open') {
      const remaining = place.openedAt + this.#options.breakerCooldownMs - now;
      if (remaining > 0) return this.#defer(place, deliveryId, 'breaker_open', jitter(remaining));
      if (this.#inFlight >= this.#options.slots) return this.#defer(place, deliveryId, 'slots_full', jitter(100));
      place.breaker = 'half_open';
      place.probeAt = now;
      return this.#grant(place, this.#owner(owner, now), deliveryId, true);
    }
    if (place.breaker === 'half_open') {
      // The others wait for the probe's end, at most its timeout: polling meanwhile costs a job
      // per waiting delivery each time and cannot send anything.
      const probeLeft = place.probeAt + this.#options.attemptTimeoutMs - now;
      return this.#defer(place, deliveryId, 'probing', jitter(Math.max(250, probeLeft)));
    }
    // Only a delivery that could be sent now makes its client one with work: a backlog behind an
    // open breaker does not shrink the other clients' shares.
    const client = this.#owner(owner, now);
    // The wait before asking again grows with the destination's backlog, so a long one polls slowly.
    const wait = jitter(Math.min(5_000, 50 * Math.ceil((place.waiting.size + 1) / this.#options.destinationSlots)));
    if (place.inFlight >= this.#options.destinationSlots) return this.#defer(place, deliveryId, 'destination_full', wait);
    if (client.inFlight >= this.#ownerShare(now)) return this.#defer(place, deliveryId, 'client_share', wait);
    if (this.#inFlight >= this.#options.slots) return this.#defer(place, deliveryId, 'slots_full', wait);
    return this.#grant(place, client, deliveryId, false);
  }

  /** Every destination this process knows, for /metrics and the push page. */
  view(): DestinationView[] {
    const now = this.#now();
    for (const [key, place] of this.#destinations) {
      if (place.inFlight === 0 && place.waiting.size === 0 && place.breaker === 'closed' && now - place.lastSeen > DESTINATION_IDLE_MS) this.#destinations.delete(key);
    }
    return [...this.#destinations].map(([destination, place]) => ({
      destination,
      breaker: place.breaker,
      inFlight: place.inFlight,
      backlog: place.waiting.size,
      consecutiveFailures: place.consecutiveFailures,
    }));
  }

  /**
   * The delivery deferred here longest at `destination` that could be sent now (its breaker closed
   * and a slot of it free), moved to the back of the backlog: a slot released there is offered to
   * it at once instead of waiting for its comeback job, which a long backlog spaces out by seconds.
   * A delivery offered and refused again (its client's share) goes behind the others, so one
   * refused delivery never keeps being offered every slot.
   */
  nextWaiting(destination: string): string | null {
    const place = this.#destinations.get(destination);
    if (!place || place.breaker !== 'closed' || place.inFlight >= this.#options.destinationSlots || this.#inFlight >= this.#options.slots) return null;
    for (const deliveryId of place.waiting) {
      place.waiting.delete(deliveryId);
      place.waiting.add(deliveryId);
      return deliveryId;
    }
    return null;
  }

  /** A delivery that ended without an attempt (cancelled, expired while waiting) leaves the backlog. */
  forget(destination: string, deliveryId: string): void {
    this.#destinations.get(destination)?.waiting.delete(deliveryId);
  }

  #ownerShare(now: number): number {
    let active = 0;
    for (const [key, owner] of this.#owners) {
      if (owner.inFlight > 0 || now - owner.lastSeen <= OWNER_ACTIVE_MS) active += 1;
      else this.#owners.delete(key);
    }
    return Math.max(1, Math.floor((this.#options.slots - reserveOf(this.#options.slots)) / Math.max(1, active)));
  }

  #destination(key: string, now: number): Destination {
    let place = this.#destinations.get(key);
    if (!place) {
      place = { inFlight: 0, breaker: 'closed', consecutiveFailures: 0, openedAt: 0, probeAt: 0, waiting: new Set(), lastSeen: now };
      this.#destinations.set(key, place);
    }
    place.lastSeen = now;
    return place;
  }

  #owner(key: string, now: number) {
    let owner = this.#owners.get(key);
    if (!owner) {
      owner = { inFlight: 0, lastSeen: now };
      this.#owners.set(key, owner);
    }
    owner.lastSeen = now;
    return owner;
  }

  #defer(place: Destination, deliveryId: string, reason: Extract<GateAnswer, { kind: 'deferred' }>['reason'], retryInMs: number): GateAnswer {
    place.waiting.add(deliveryId);
    return { kind: 'deferred', reason, retryInMs };
  }

  #grant(place: Destination, client: { inFlight: number; lastSeen: number }, deliveryId: string, probe: boolean): GateAnswer {
    place.waiting.delete(deliveryId);
    place.inFlight += 1;
    client.inFlight += 1;
    this.#inFlight += 1;
    let released = false;
    return {
      kind: 'granted',
      probe,
      release: (outcome) => {
        if (released) return;
        released = true;
        place.inFlight -= 1;
        client.inFlight -= 1;
        this.#inFlight -= 1;
        client.lastSeen = this.#now();
        if (outcome === 'success') {
          place.consecutiveFailures = 0;
          place.breaker = 'closed';
        } else if (outcome === 'failure') {
          place.consecutiveFailures += 1;
          // An attempt begun before the breaker opened that fails now does not touch it: a probe may
          // be in flight, and opening again would let a second one start beside it.
          if (probe || (place.breaker === 'closed' && place.consecutiveFailures >= this.#options.breakerFailures)) {
            place.breaker = 'open';
            place.openedAt = this.#now();
          }
        } else if (probe) {
          // A probe that sent nothing (not due, deadline passed) leaves the breaker to the next one.
          place.breaker = 'open';
        }
      },
    };
  }
}

/** The push gate of this process, once its push worker started (null in a process without one). */
export type PushDestinations = { gate: DestinationGate | null };
