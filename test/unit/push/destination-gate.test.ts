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

  it('shares the slots between the clients with work', () => {
    const { gate } = gateAt();
    const held = Array.from({ length: 16 }, (_, index) => granted(gate.acquire(`r${index}:80`, 'b', `b${index}`)));
    // B alone had all 16; A arrives: the slots are full, A waits for the next one to free.
    expect(gate.acquire('a:80', 'a', 'a1')).toMatchObject({ kind: 'deferred', reason: 'slots_full' });
    held[0]!.release('success');
    // B is over its share of 8 now that A has work: the freed slot goes to A.
    expect(gate.acquire('r0:80', 'b', 'b16')).toMatchObject({ kind: 'deferred', reason: 'client_share' });
    granted(gate.acquire('a:80', 'a', 'a1'));
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
