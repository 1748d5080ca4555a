import { describe, expect, it } from 'vitest';
import type { ChainLink } from '../../../src/agents/agent-registry.js';
import { silentLogger } from '../../../src/log/logger.js';
import type { ProviderFailure, ProviderOutcome } from '../../../src/providers/provider.js';
import { AuditTrail } from '../../../src/runs/audit-trail.js';
import {
  appliedLinkIndex,
  chainExhausted,
  planCeilingChange,
  providerChainOf,
  retriesOnSameProvider,
  retryDelayMs,
  type ProviderSwitch,
} from '../../../src/runs/provider-chain.js';

// The chain's decisions: which provider is asked, when a failure is retried or handed to the next
// provider, and what a fallback's ceilings do to stored answers.

const policy = { providerAttempts: 3, providerBackoffMs: 100, maxBackoffMs: 1_000 };
const failure = (cls: ProviderFailure['class'], retryAfterMs?: number): ProviderFailure => ({ class: cls, message: cls, ...(retryAfterMs === undefined ? {} : { retryAfterMs }) });
const reply: ProviderOutcome = { ok: true, reply: { text: 'done', toolCalls: [], artifacts: [], usage: { inputTokens: 1, outputTokens: 1 } } };

/** A link whose provider answers from a script and counts its calls. */
function link(name: string, outcomes: ProviderOutcome[], ceilings: ChainLink['ceilings'] = { auditLevel: 'full', answerLevel: 'full' }) {
  const calls: number[] = [];
  const chainLink: ChainLink = {
    ceilings,
    provider: {
      name,
      type: 'scripted',
      call: async () => {
        calls.push(calls.length + 1);
        return outcomes[Math.min(calls.length - 1, outcomes.length - 1)]!;
      },
    },
  };
  return { chainLink, calls };
}

function chainOver(links: ChainLink[], switchTo: (index: number) => ProviderSwitch = () => 'applied', retry = { ...policy, providerBackoffMs: 0, maxBackoffMs: 0 }) {
  const switches: number[] = [];
  const chain = providerChainOf(
    {
      runId: 'run-1',
      chain: links,
      tools: [],
      policy: retry,
      audit: new AuditTrail('run-1', 'full', 0, silentLogger()),
      lease: { loss: null, abort: new AbortController(), cancelled: new AbortController() },
      switchTo: async (index) => (switches.push(index), switchTo(index)),
    },
    0,
  );
  return { chain, switches };
}

const request = { providerIndex: 0, iteration: 0, transcript: [{ role: 'user' as const, content: 'hi' }] };

describe('the provider chain decides', () => {
  it('retries a retryable failure on the same provider, then hands the run to the next one', async () => {
    const primary = link('primary', [{ ok: false, failure: failure('server_error') }]);
    const fallback = link('fallback', [reply]);
    const { chain, switches } = chainOver([primary.chainLink, fallback.chainLink]);
    expect(await chain.call(request)).toMatchObject({ kind: 'reply', providerIndex: 1, reply: { text: 'done' } });
    expect(primary.calls).toHaveLength(3);
    expect(switches).toEqual([1]);
    // The fallback's ceilings are applied once: the next call starts where the loop stands.
    expect(await chain.call({ ...request, providerIndex: 1 })).toMatchObject({ kind: 'reply', providerIndex: 1 });
    expect(switches).toEqual([1]);
  });

  it('does not retry a failure that is not retryable, and fails the run with the last class once the chain is spent', async () => {
    const primary = link('primary', [{ ok: false, failure: failure('rate_limit') }]);
    const fallback = link('fallback', [{ ok: false, failure: failure('auth', undefined) }]);
    const { chain } = chainOver([primary.chainLink, fallback.chainLink]);
    expect(await chain.call(request)).toEqual({ kind: 'failed', reason: 'not_retryable', errorClass: 'auth', detail: { provider: 'fallback', class: 'auth', status: null } });
    expect(primary.calls).toHaveLength(3);
    expect(fallback.calls).toHaveLength(1);
  });

  it('stops without asking a provider whose switch found the run no longer held', async () => {
    const primary = link('primary', [{ ok: false, failure: failure('connection') }]);
    const fallback = link('fallback', [reply]);
    const { chain } = chainOver([primary.chainLink, fallback.chainLink], () => 'lost');
    expect(await chain.call(request)).toEqual({ kind: 'stop', why: 'lease_lost' });
    expect(fallback.calls).toHaveLength(0);
  });

  it('fails a task whose fallback leaves no retainable result, naming the provider and its ceiling', async () => {
    const primary = link('primary', [{ ok: false, failure: failure('connection') }]);
    const fallback = link('fallback', [reply], { auditLevel: 'none', answerLevel: 'metadata' });
    const { chain } = chainOver([primary.chainLink, fallback.chainLink], () => 'not_retainable');
    expect(await chain.call(request)).toEqual({
      kind: 'failed',
      reason: 'result_not_retainable',
      errorClass: 'privacy',
      detail: { provider: 'fallback', answerLevel: 'metadata' },
    });
    expect(fallback.calls).toHaveLength(0);
  });

  it('waits doubling from the base, at least Retry-After, at most the maximum', () => {
    expect([1, 2, 3].map((attempt) => retryDelayMs(failure('server_error'), attempt, policy))).toEqual([100, 200, 400]);
    expect(retryDelayMs(failure('rate_limit', 700), 1, policy)).toBe(700);
    expect(retryDelayMs(failure('rate_limit', 5_000), 1, policy)).toBe(1_000);
    expect(retriesOnSameProvider(failure('server_error'), 2, policy)).toBe(true);
    expect(retriesOnSameProvider(failure('server_error'), 3, policy)).toBe(false);
    expect(retriesOnSameProvider(failure('client_error'), 1, policy)).toBe(false);
  });

  it('reports a retryable last failure as provider_failed', () => {
    const { chainLink } = link('only', []);
    expect(chainExhausted([chainLink], failure('server_error'))).toMatchObject({ reason: 'provider_failed', errorClass: 'server_error' });
  });

  it('reads the applied link from the run row, the primary when the row names none of the chain', () => {
    const links = [link('primary', []).chainLink, link('fallback', []).chainLink];
    expect(appliedLinkIndex(links, 'fallback')).toBe(1);
    expect(appliedLinkIndex(links, null)).toBe(0);
    expect(appliedLinkIndex(links, 'gone')).toBe(0);
  });

  it('plans what a fallback ceiling does to stored answers', () => {
    const full = { auditLevel: 'full', answerLevel: 'full' } as const;
    expect(planCeilingChange(full, full, true)).toMatchObject({ answers: 'kept', next: full });
    expect(planCeilingChange(full, { auditLevel: 'metadata', answerLevel: 'redacted' }, true)).toMatchObject({
      answers: 'tightened',
      next: { auditLevel: 'metadata', answerLevel: 'redacted' },
    });
    // Never loosened: a looser fallback keeps the run's tighter ceilings.
    expect(planCeilingChange({ auditLevel: 'none', answerLevel: 'redacted' }, full, true)).toMatchObject({ answers: 'kept', next: { auditLevel: 'none', answerLevel: 'redacted' } });
    // Only a task needs a retainable result; a run without one keeps what the level allows.
    expect(planCeilingChange(full, { auditLevel: 'full', answerLevel: 'metadata' }, true).answers).toBe('not_retainable');
    expect(planCeilingChange(full, { auditLevel: 'full', answerLevel: 'metadata' }, false).answers).toBe('tightened');
  });
});
