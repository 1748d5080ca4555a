import { describe, expect, it } from 'vitest';
import { buildAgentRegistry } from '../../../src/agents/agent-registry.js';
import { loadConfig } from '../../../src/config/load-config.js';
import { createGuardedFetch } from '../../../src/net/guarded-fetch.js';

// How a statechart agent is configured: `machine` instead of `provider`, the machine loaded and
// checked at start, and the agent-loop settings that would do nothing for a machine refused.

const ORDER = new URL('../../fixtures/statecharts/order.machine.ts', import.meta.url).pathname;
const NOT_A_MACHINE = new URL('../../fixtures/test-tools.ts', import.meta.url).pathname;

async function build(agents: unknown[]) {
  const loaded = loadConfig({ configPath: undefined, cwd: process.cwd(), env: { KEEL_DATABASE_URL: 'postgres://127.0.0.1/unused', KEEL_AGENTS: JSON.stringify(agents) } });
  if (!loaded.ok) return { config: loaded.problems, registry: null };
  const fetch = createGuardedFetch(loaded.config.security.addressGuard);
  try {
    return { config: null, registry: await buildAgentRegistry(loaded.config, { fetch }) };
  } finally {
    await fetch.close();
  }
}

describe('a statechart agent in the config', () => {
  it('needs no provider; its machine is loaded with its hash and steps, and a model call without a provider fails naming it', async () => {
    const { registry } = await build([{ id: 'order', name: 'Order', machine: ORDER }]);
    expect(registry?.ok).toBe(true);
    const agent = registry!.ok ? registry!.registry.get('order')! : null;
    expect(agent!.statechart!.hash).toMatch(/^[0-9a-f]{16}$/);
    expect([...agent!.statechart!.steps.keys()].sort()).toEqual(['approve', 'ask', 'charge', 'check', 'pay']);
    const outcome = await agent!.chain[0]!.provider.call({ runId: 'r', iteration: 0, transcript: [], tools: [], signal: new AbortController().signal });
    expect(outcome.ok === false && outcome.failure.message).toBe('agent order names no provider: a callModel step needs one (set provider in its config)');
  });

  it('an agent with neither provider nor machine is refused with a clear message', async () => {
    const { config } = await build([{ id: 'nothing', name: 'Nothing' }]);
    expect(config).toContain('agents.0 (nothing): provider is required (or machine, for an agent written as a statechart)');
  });

  it('guardrails on a statechart agent are refused at start', async () => {
    const { registry } = await build([{ id: 'order', name: 'Order', machine: ORDER, guardrails: [{ type: 'denyPattern', name: 'cards', patterns: ['\\d{16}'] }] }]);
    expect(registry?.ok === false && registry.problems).toEqual([
      'agents.0 (order): guardrails apply to the agent loop, not to a statechart agent: check in a step of the machine instead',
    ]);
  });

  it('a module without a machine, or one that cannot be loaded, is refused naming the module', async () => {
    const missing = await build([{ id: 'order', name: 'Order', machine: '/nowhere/x.machine.ts' }]);
    expect(missing.registry?.ok === false && missing.registry.problems[0]).toMatch(/^agents\.0 \(order\): machine \/nowhere\/x\.machine\.ts cannot be loaded/);
    const none = await build([{ id: 'order', name: 'Order', machine: NOT_A_MACHINE }]);
    expect(none.registry?.ok === false && none.registry.problems[0]).toMatch(/exports no XState machine/);
  });
});
