import { existsSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { parseDocument } from 'yaml';
import type { z } from 'zod';
import { configSchema, type ParsedConfig } from './config-schema.js';
import { envNameForPath, listEnvLeaves, parseEnvValue, setAtPath } from './env-overrides.js';

export type KeelConfig = Omit<ParsedConfig, 'server' | 'security'> & {
  server: ParsedConfig['server'] & { publicUrl: string };
  security: ParsedConfig['security'] & { masterKeyFile: string };
  /** The file the config came from, or null when Keel runs on defaults. */
  source: string | null;
};

export type LoadConfigResult = { ok: true; config: KeelConfig } | { ok: false; problems: string[] };

export type LoadConfigOptions = {
  configPath?: string | undefined;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
};

export const DEFAULT_CONFIG_FILE = 'keel.config.yaml';
const LOOPBACK_HOSTS = new Set(['127.0.0.1', 'localhost', '::1']);

function findConfigFile(options: LoadConfigOptions, cwd: string): { path: string | null; explicit: boolean } {
  const named = options.configPath ?? options.env?.KEEL_CONFIG;
  if (named) return { path: resolve(cwd, named), explicit: true };
  const fallback = resolve(cwd, DEFAULT_CONFIG_FILE);
  return { path: existsSync(fallback) ? fallback : null, explicit: false };
}

/** Where paths the config names (tool modules, machines, guardrail modules) are resolved from: the config file's directory. */
export function configBaseDir(config: { source?: string | null | undefined }): string {
  return config.source ? dirname(config.source) : process.cwd();
}

function readYaml(path: string): { ok: true; value: Record<string, unknown> } | { ok: false; problems: string[] } {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    return { ok: false, problems: [`config file ${path}: cannot be read (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`] };
  }
  const document = parseDocument(text);
  if (document.errors.length > 0) {
    return { ok: false, problems: document.errors.map((error) => `config file ${path}: ${error.message.split('\n')[0]}`) };
  }
  const value: unknown = document.toJS() ?? {};
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    return { ok: false, problems: [`config file ${path}: expected a mapping of keys at the top level`] };
  }
  return { ok: true, value: value as Record<string, unknown> };
}

/** In YAML an empty section (`database:` with only comments) is null; treat it as absent. */
function dropNulls(value: Record<string, unknown>): Record<string, unknown> {
  for (const [key, child] of Object.entries(value)) {
    if (child === null) delete value[key];
    else if (typeof child === 'object' && !Array.isArray(child)) dropNulls(child as Record<string, unknown>);
  }
  return value;
}

function describeIssue(issue: z.ZodIssue, envSources: Map<string, string>): string {
  const path = issue.path.join('.') || '(root)';
  const source = [...envSources.entries()].find(([key]) => path === key || path.startsWith(`${key}.`));
  const from = source ? ` (from ${source[1]})` : '';
  switch (issue.code) {
    case 'unrecognized_keys':
      return issue.keys.map((key) => `${issue.path.length ? `${path}.` : ''}${key}: unknown key`).join('\n');
    case 'invalid_type':
      return `${path}: expected ${issue.expected}, received ${issue.received}${from}`;
    case 'invalid_enum_value':
      return `${path}: expected one of ${issue.options.map((option) => JSON.stringify(option)).join(', ')}, received ${JSON.stringify(issue.received)}${from}`;
    case 'invalid_union_discriminator':
      return `${path}: expected one of ${issue.options.map((option) => JSON.stringify(option)).join(', ')}${from}`;
    default:
      return `${path}: ${issue.message}${from}`;
  }
}

/** Checks that span keys: references between providers and agents, and unsafe combinations. */
function crossCheck(config: ParsedConfig): string[] {
  const problems: string[] = [];
  const seen = new Set<string>();
  config.agents.forEach((agent, index) => {
    const where = `agents.${index} (${agent.id})`;
    if (seen.has(agent.id)) problems.push(`${where}: duplicate agent id "${agent.id}"`);
    seen.add(agent.id);
    if (agent.provider === undefined && agent.machine === undefined) problems.push(`${where}: provider is required (or machine, for an agent written as a statechart)`);
    if (agent.provider === undefined && agent.fallbacks.length > 0) problems.push(`${where}: fallbacks need a provider to fall back from`);
    [...(agent.provider === undefined ? [] : [agent.provider]), ...agent.fallbacks].forEach((name) => {
      if (!config.providers[name]) problems.push(`${where}: provider "${name}" is not defined under providers`);
    });
  });
  if (config.agents.length === 0) problems.push('agents: expected at least one agent');
  const remoteIds = new Set<string>();
  config.remoteAgents.forEach((remote, index) => {
    if (remoteIds.has(remote.id)) problems.push(`remoteAgents.${index}: duplicate remote agent id "${remote.id}"`);
    remoteIds.add(remote.id);
    const trusted = remote.cardKey !== undefined || (remote.cardJku ?? []).length > 0;
    if (remote.requireSignedCard && !trusted) problems.push(`remoteAgents.${index} (${remote.id}): requireSignedCard needs cardKey or cardJku, the key the card must be signed with`);
    if (!remote.requireSignedCard && trusted) problems.push(`remoteAgents.${index} (${remote.id}): cardKey and cardJku take effect only with requireSignedCard: true`);
  });
  const signing = config.security.cardSigning;
  if (signing && (signing.keyFile === undefined) === (signing.keySealed === undefined)) {
    problems.push('security.cardSigning: give exactly one of keyFile and keySealed');
  }
  if (config.auth.mode === 'none' && !LOOPBACK_HOSTS.has(config.server.host)) {
    problems.push(`auth.mode: "none" is only allowed when server.host is a loopback address, not "${config.server.host}"`);
  }
  // The gRPC binding takes the same unauthenticated calls, so it is held to the same bind rule.
  if (config.auth.mode === 'none' && config.grpc.port !== undefined && config.grpc.host !== undefined && !LOOPBACK_HOSTS.has(config.grpc.host)) {
    problems.push(`auth.mode: "none" is only allowed when grpc.host is a loopback address, not "${config.grpc.host}"`);
  }
  return problems;
}

export function loadConfig(options: LoadConfigOptions = {}): LoadConfigResult {
  const env = options.env ?? process.env;
  const cwd = options.cwd ?? process.cwd();
  const file = findConfigFile({ ...options, env }, cwd);
  let raw: Record<string, unknown> = {};
  if (file.path) {
    if (!existsSync(file.path)) {
      if (file.explicit) return { ok: false, problems: [`config file ${file.path}: not found`] };
    } else {
      const yaml = readYaml(file.path);
      if (!yaml.ok) return yaml;
      raw = dropNulls(yaml.value);
    }
  }

  const problems: string[] = [];
  const envSources = new Map<string, string>();
  for (const leaf of listEnvLeaves(configSchema)) {
    const value = env[leaf.envName];
    if (value === undefined) continue;
    const parsed = parseEnvValue(leaf, value);
    if (!parsed.ok) {
      problems.push(`${leaf.path.join('.')}: ${parsed.error} (from ${leaf.envName})`);
      continue;
    }
    setAtPath(raw, leaf.path, parsed.value);
    envSources.set(leaf.path.join('.'), leaf.envName);
  }

  const result = configSchema.safeParse(raw);
  if (!result.success) {
    problems.push(...result.error.issues.flatMap((issue) => describeIssue(issue, envSources).split('\n')));
  }
  if (problems.length > 0 || !result.success) return { ok: false, problems };

  const crossProblems = crossCheck(result.data);
  if (crossProblems.length > 0) return { ok: false, problems: crossProblems };

  const parsed = result.data;
  const dataDir = isAbsolute(parsed.dataDir) ? parsed.dataDir : resolve(cwd, parsed.dataDir);
  const publicHost = parsed.server.host === '0.0.0.0' || parsed.server.host === '::' ? '127.0.0.1' : parsed.server.host;
  return {
    ok: true,
    config: {
      ...parsed,
      dataDir,
      server: {
        ...parsed.server,
        publicUrl: (parsed.server.publicUrl ?? `http://${publicHost.includes(':') ? `[${publicHost}]` : publicHost}:${parsed.server.port}`).replace(/\/+$/, ''),
      },
      security: {
        ...parsed.security,
        masterKeyFile: parsed.security.masterKeyFile
          ? resolve(cwd, parsed.security.masterKeyFile)
          : resolve(dataDir, 'master.key'),
        ...(parsed.security.cardSigning
          ? { cardSigning: { ...parsed.security.cardSigning, ...(parsed.security.cardSigning.keyFile ? { keyFile: resolve(cwd, parsed.security.cardSigning.keyFile) } : {}) } }
          : {}),
      },
      remoteAgents: parsed.remoteAgents.map((remote) => (remote.cardKey ? { ...remote, cardKey: resolve(cwd, remote.cardKey) } : remote)),
      source: file.path && existsSync(file.path) ? file.path : null,
    },
  };
}

export { envNameForPath };
