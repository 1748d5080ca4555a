import { describe, it, expect } from 'vitest';
import type { ProviderConfig } from '../../../src/config/config-schema.js';
import type { GuardedFetch } from '../../../src/net/guarded-fetch.js';
import { createProvider, createProviders } from '../../../src/providers/create-provider.js';

// A fetch that must never be called: building providers makes no requests.
const noFetch: GuardedFetch = async () => {
  throw new Error('no request expected');
};

describe('createProvider', () => {
  it('builds echo, scripted and openai providers with their names and types', () => {
    expect(createProvider('e', { type: 'echo' }, { fetch: noFetch })).toMatchObject({ name: 'e', type: 'echo' });
    expect(createProvider('s', { type: 'scripted', steps: [{ reply: 'x' }] }, { fetch: noFetch })).toMatchObject({
      name: 's',
      type: 'scripted',
    });
    expect(
      createProvider('o', { type: 'openai', baseUrl: 'http://127.0.0.1:1/v1', model: 'm', timeoutSeconds: 5 }, { fetch: noFetch }),
    ).toMatchObject({ name: 'o', type: 'openai' });
  });

  it('passes scripted steps through', async () => {
    const provider = createProvider('s', { type: 'scripted', steps: [{ reply: 'scripted!' }] }, { fetch: noFetch });
    const outcome = await provider.call({ runId: 'r', iteration: 0, transcript: [], tools: [], signal: new AbortController().signal });
    expect(outcome.ok && outcome.reply.text).toBe('scripted!');
  });

  it('passes env through to the openai provider', async () => {
    const provider = createProvider(
      'o',
      { type: 'openai', baseUrl: 'http://127.0.0.1:1/v1', model: 'm', apiKeyEnv: 'KEEL_TEST_MISSING_KEY', timeoutSeconds: 5 },
      { fetch: noFetch, env: {} },
    );
    const outcome = await provider.call({ runId: 'r', iteration: 0, transcript: [], tools: [], signal: new AbortController().signal });
    expect(outcome).toMatchObject({ ok: false, failure: { class: 'configuration' } });
  });

  it('builds the conformance provider, which answers by messageId prefix', async () => {
    const provider = createProvider('c', { type: 'conformance', streamTimeoutSeconds: 5 }, { fetch: noFetch });
    expect(provider).toMatchObject({ name: 'c', type: 'conformance' });
    const outcome = await provider.call({
      runId: 'r',
      iteration: 0,
      transcript: [],
      tools: [],
      signal: new AbortController().signal,
      requestMetadata: { messageId: 'tck-complete-task-1' },
    });
    expect(outcome).toMatchObject({ ok: true, reply: { outcome: { kind: 'status_message', text: 'Hello from TCK' } } });
  });
});

describe('createProviders', () => {
  it('builds a map keyed by provider name', () => {
    const configs: Record<string, ProviderConfig> = {
      echo: { type: 'echo' },
      script: { type: 'scripted', steps: [] },
    };
    const providers = createProviders(configs, { fetch: noFetch });
    expect([...providers.keys()]).toEqual(['echo', 'script']);
    expect(providers.get('script')?.type).toBe('scripted');
    expect(providers.get('echo')?.name).toBe('echo');
  });
});
