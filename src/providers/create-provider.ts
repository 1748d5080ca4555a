import { createConformanceProvider } from './conformance-provider.js';
import type { ProviderConfig } from '../config/config-schema.js';
import type { GuardedFetch } from '../net/guarded-fetch.js';
import { createEchoProvider } from './echo-provider.js';
import { createOpenAiProvider } from './openai-provider.js';
import type { Provider } from './provider.js';
import { createScriptedProvider } from './scripted-provider.js';

// Builds providers from the `providers` section of the config.

export type ProviderDeps = {
  /** The one entry point for outbound HTTP (address guard). */
  fetch: GuardedFetch;
  /** Where API keys are read from; defaults to process.env at call time. */
  env?: NodeJS.ProcessEnv;
};

export function createProvider(name: string, config: ProviderConfig, deps: ProviderDeps): Provider {
  switch (config.type) {
    case 'echo':
      return createEchoProvider(name);
    case 'scripted':
      return createScriptedProvider(name, config.steps);
    case 'openai':
      return createOpenAiProvider(
        name,
        { baseUrl: config.baseUrl, model: config.model, apiKeyEnv: config.apiKeyEnv, timeoutSeconds: config.timeoutSeconds },
        deps.env === undefined ? { fetch: deps.fetch } : { fetch: deps.fetch, env: deps.env },
      );
    case 'conformance':
      return createConformanceProvider(name, { streamTimeoutMs: config.streamTimeoutSeconds * 1000 });
  }
}

/** One provider per configured name. */
export function createProviders(configs: Record<string, ProviderConfig>, deps: ProviderDeps): Map<string, Provider> {
  const providers = new Map<string, Provider>();
  for (const [name, config] of Object.entries(configs)) providers.set(name, createProvider(name, config, deps));
  return providers;
}
