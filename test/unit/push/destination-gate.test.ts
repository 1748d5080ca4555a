import { describe, expect, it } from 'vitest';
import { DestinationGate, destinationOf, type GateAnswer } from '../../../src/push/destination-gate.js';

// The destination gate alone, on a clock the test moves (docs/push.md, "Isolation").

function gateAt(start = 1_000) {
  let now = start;
  const gate = new DestinationGate({ slots: 16, destinationSlots: 4, breakerFailures: 3, breakerCooldownMs: 1_000, attemptTimeoutMs: 3_000 }, () => now);
  return { gate, advance: (ms: number) => (now += ms) };
}

const granted = (answer: GateAnswer) => {
  if (answer.kind !== 'granted') throw new Error(`expected a slot, got ${answer.reason}`);
  return answer;
};

describe('destination gate', () => {
  it('names a destination by host and port', () => {
    expect(destinationOf('https://hooks.example.com/a?b')).toBe('hooks.example.com:443');
    expect(destinationOf('http://127.0.0.1:8080/hook')).toBe('127.0.0.1:8080');
  });

  it('gives a destination at most its share of the slots', () => {
    const { gate } = gateAt();
    for (let index = 0; index < 4; index += 1) granted(gate.acquire('hung:80', 'b', `d${index}`));
    expect(gate.acquire('hung:80', 'b', 'd4')).toMatchObject({ kind: 'deferred', reason: 'destination_full' });
    granted(gate.acquire('healthy:80', 'a', 'a1'));
    expect(gate.view().find((view) => view.destination === 'hung:80')).toMatchObject({ inFlight: 4, backlog: 1, breaker: 'closed' });
  });

  it('offers a released slot to the delivery waiting longest there, and none while the destination is full or its breaker open', () => {
    const { gate } = gateAt();
    const held = Array.from({ length: 4 }, (_, index) => granted(gate.acquire('one:80', 'b', `d${index}`)));
    for (const id of ['w1', 'w2', 'w3']) expect(gate.acquire('one:80', 'b', id)).toMatchObject({ kind: 'deferred', reason: 'destination_full' });
    expect(gate.nextWaiting('one:80'), 'full: nothing to offer').toBeNull();
    held[0]!.release('success');
    expect(gate.nextWaiting('one:80')).toBe('w1');
    // Offered and not taken (yet): the next offer goes to the one behind it.
    expect(gate.nextWaiting('one:80')).toBe('w2');
    granted(gate.acquire('one:80', 'b', 'w1'));
    expect(gate.view().find((view) => view.destination === 'one:80')).toMatchObject({ inFlight: 4, backlog: 2 });
    // Three consecutive failures open the breaker.
    for (const slot of held.slice(1)) slot.release('failure');
    expect(gate.nextWaiting('one:80'), 'breaker open: nothing to offer').toBeNull();
    expect(gate.nextWaiting('unknown:80')).toBeNull();
  });

  it('shares the slots between the clients with work and keeps a reserve for a client that has none', () => {
    const { gate } = gateAt();
    // B alone: 14 of the 16 slots, 2 kept in reserve.
    const held = Array.from({ length: 14 }, (_, index) => granted(gate.acquire(`r${index}:80`, 'b', `b${index}`)));
    expect(gate.acquire('r14:80', 'b', 'b14')).toMatchObject({ kind: 'deferred', reason: 'client_share' });
    // A arrives: its head goes at once, without waiting for one of B's requests to end.
    granted(gate.acquire('a:80', 'a', 'a1'));
    // B is over its share of 7 now that A has work: a slot B frees is not B's again.
    held[0]!.release('success');
    expect(gate.acquire('r0:80', 'b', 'b15')).toMatchObject({ kind: 'deferred', reason: 'client_share' });
    // C arrives too: the reserve still has a slot for its head.
    granted(gate.acquire('c:80', 'c', 'c1'));
    for (const slot of held.slice(1, 10)) slot.release('success');
    // Three clients: floor(14 / 3) = 4 each; B holds 4, A and C get theirs.
    expect(gate.acquire('r0:80', 'b', 'b15')).toMatchObject({ kind: 'deferred', reason: 'client_share' });
    for (let index = 2; index <= 4; index += 1) granted(gate.acquire(`a${index}:80`, 'a', `a${index}`));
    expect(gate.acquire('a5:80', 'a', 'a5')).toMatchObject({ kind: 'deferred', reason: 'client_share' });
  });

  it('keeps at least one slot per client when the slots are few', () => {
    let now = 0;
    const gate = new DestinationGate({ slots: 1, destinationSlots: 1, breakerFailures: 3, breakerCooldownMs: 1_000, attemptTimeoutMs: 3_000 }, () => now);
    const only = granted(gate.acquire('a:80', 'a', 'a1'));
    expect(gate.acquire('b:80', 'b', 'b1')).toMatchObject({ kind: 'deferred', reason: 'slots_full' });
    only.release('success');
    now += 1;
    granted(gate.acquire('b:80', 'b', 'b1'));
  });

  it('opens after consecutive failures, probes once after the cool-down and closes on an answer', () => {
    const { gate, advance } = gateAt();
    const first = [1, 2, 3].map((index) => granted(gate.acquire('hung:80', 'b', `d${index}`)));
    const late = granted(gate.acquire('hung:80', 'b', 'd4'));
    for (const slot of first) slot.release('failure');
    expect(gate.acquire('hung:80', 'b', 'd5')).toMatchObject({ kind: 'deferred', reason: 'breaker_open' });
    advance(1_000);
    const probe = granted(gate.acquire('hung:80', 'b', 'd5'));
    expect(probe.probe).toBe(true);
    // An attempt begun before the breaker opened fails now: no second probe beside the first.
    late.release('failure');
    expect(gate.acquire('hung:80', 'b', 'd6')).toMatchObject({ kind: 'deferred', reason: 'probing' });
    probe.release('failure');
    expect(gate.view()[0]).toMatchObject({ breaker: 'open' });
    advance(1_000);
    granted(gate.acquire('hung:80', 'b', 'd6')).release('success');
    expect(gate.view()[0]).toMatchObject({ breaker: 'closed', consecutiveFailures: 0 });
    granted(gate.acquire('hung:80', 'b', 'd7'));
  });
});
