import type { AgentConfig } from '../config/config-schema.js';
import { configBaseDir, type KeelConfig } from '../config/load-config.js';
import type { Guardrail } from '../guardrails/guardrail.js';
import { loadGuardrails } from '../guardrails/load-guardrails.js';
import type { GuardedFetch } from '../net/guarded-fetch.js';
import { answerIsRetainable, resolveCeilings, type Ceilings } from '../privacy/resolve-ceilings.js';
import { createProvider } from '../providers/create-provider.js';
import type { Provider } from '../providers/provider.js';
import { loadStatechart, type StatechartDefinition } from '../statecharts/statechart-definition.js';
import { httpGetTool } from '../tools/http-get-tool.js';
import { loadToolModules } from '../tools/load-tool-modules.js';
import type { ToolDefinition } from '../tools/tool.js';

// Agents (publication profiles) resolved from config once at start: their provider chain with the
// privacy ceilings each provider implies, their tools and their guardrails.

export type ChainLink = { provider: Provider; ceilings: Ceilings };

export type RegisteredAgent = {
  config: AgentConfig;
  /** Primary first, then fallbacks in order. */
  chain: ChainLink[];
  tools: Map<string, ToolDefinition>;
  guardrails: Guardrail[];
  /** A statechart agent's machine (docs/statechart-agents.md): it drives the run instead of the agent loop. */
  statechart?: StatechartDefinition;
};

export type AgentRegistry = {
  agents: Map<string, RegisteredAgent>;
  /** The first agent of the config: the root agent card's. */
  defaultAgentId: string;
  get: (id: string) => RegisteredAgent | undefined;
};

export type BuildRegistryResult = { ok: true; registry: AgentRegistry } | { ok: false; problems: string[] };

/** Tools every agent may list by name; `remote_agent` is added by the remote-agents feature (extraTools). */
export const BUILT_IN_TOOLS: readonly ToolDefinition[] = [httpGetTool];

export type RegistryDeps = {
  fetch: GuardedFetch;
  env?: NodeJS.ProcessEnv;
  /** Providers built elsewhere (tests) by name; they take precedence. */
  extraProviders?: Map<string, Provider>;
  extraTools?: readonly ToolDefinition[];
};

export async function buildAgentRegistry(config: KeelConfig, deps: RegistryDeps): Promise<BuildRegistryResult> {
  const baseDir = configBaseDir(config);
  const problems: string[] = [];

  const loaded = await loadToolModules(config.toolModules, baseDir);
  if (!loaded.ok) problems.push(...loaded.problems);
  const toolsByName = new Map<string, ToolDefinition>();
  for (const tool of [...BUILT_IN_TOOLS, ...(deps.extraTools ?? []), ...(loaded.ok ? loaded.tools : [])]) {
    if (toolsByName.has(tool.name)) problems.push(`toolModules: tool "${tool.name}" is defined twice`);
    toolsByName.set(tool.name, tool);
  }

  const providers = new Map<string, Provider>();
  const providerFor = (name: string): Provider => {
    let provider = deps.extraProviders?.get(name) ?? providers.get(name);
    if (!provider) {
      provider = createProvider(name, config.providers[name]!, { fetch: deps.fetch, ...(deps.env ? { env: deps.env } : {}) });
      providers.set(name, provider);
    }
    return provider;
  };

  const agents = new Map<string, RegisteredAgent>();
  for (const [index, agent] of config.agents.entries()) {
    const where = `agents.${index} (${agent.id})`;
    const chain: ChainLink[] = [];
    for (const name of [...(agent.provider === undefined ? [] : [agent.provider]), ...agent.fallbacks]) {
      const providerConfig = config.providers[name];
      if (!providerConfig) {
        problems.push(`${where}: provider "${name}" is not defined under providers`);
        continue;
      }
      try {
        chain.push({
          provider: providerFor(name),
          ceilings: resolveCeilings({ global: config.privacy.level, provider: providerConfig.privacy, agent: agent.privacy }),
        });
      } catch (error) {
        problems.push(`${where}: provider "${name}": ${(error as Error).message}`);
      }
    }
    let statechart: StatechartDefinition | undefined;
    if (agent.machine !== undefined) {
      const loaded = await loadStatechart(agent.machine, baseDir, where);
      if (loaded.ok) statechart = loaded.definition;
      else problems.push(...loaded.problems);
      // Guardrails check the agent loop's input and answers; a machine decides for itself, so a
      // guardrail configured here would look like protection and do nothing.
      if (agent.guardrails.length > 0) problems.push(`${where}: guardrails apply to the agent loop, not to a statechart agent: check in a step of the machine instead`);
      // Without a provider, the run's ceilings are the installation's and the agent's, and a callModel step fails naming the missing provider.
      if (agent.provider === undefined) {
        chain.push({ provider: noProvider(agent.id), ceilings: resolveCeilings({ global: config.privacy.level, agent: agent.privacy }) });
      }
    }
    const tools = new Map<string, ToolDefinition>();
    for (const name of agent.tools) {
      const tool = toolsByName.get(name);
      if (!tool) problems.push(`${where}: tool "${name}" is not a built-in tool nor exported by any of toolModules`);
      else tools.set(name, tool);
    }
    const guardrails = await loadGuardrails(agent.guardrails, where, baseDir);
    if (!guardrails.ok) problems.push(...guardrails.problems);
    agents.set(agent.id, { config: agent, chain, tools, guardrails: guardrails.ok ? guardrails.guardrails : [], ...(statechart ? { statechart } : {}) });
  }

  if (problems.length > 0) return { ok: false, problems };
  const defaultAgentId = config.agents[0]!.id;
  return { ok: true, registry: { agents, defaultAgentId, get: (id) => agents.get(id) } };
}

/** The provider of a statechart agent that names none: a model call fails and says so. */
function noProvider(agentId: string): Provider {
  return {
    name: 'none',
    type: 'echo',
    call: async () => ({
      ok: false,
      failure: { class: 'configuration', message: `agent ${agentId} names no provider: a callModel step needs one (set provider in its config)` },
    }),
  };
}

/** Agents whose primary answer ceiling keeps no result: A2A refuses them before any task exists. */
export function unretainableAgents(registry: AgentRegistry): string[] {
  return [...registry.agents.values()]
    .filter((agent) => agent.chain[0] && !answerIsRetainable(agent.chain[0].ceilings.answerLevel))
    .map((agent) => agent.config.id);
}
