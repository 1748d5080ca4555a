import type { AgentConfig } from '../config/config-schema.js';
import type { KeelConfig } from '../config/load-config.js';

// An agent's card, built from its config. Both bindings share one base URL: JSON-RPC posts to it,
// HTTP+JSON appends the specification's paths. Capabilities are declared as they are.

export const PROTOCOL_VERSION = '1.0';

/** The media types every Keel agent accepts in message parts (the card's defaultInputModes). */
export const INPUT_MODES: readonly string[] = ['text/plain', 'application/json'];

/** Whether a part's media type is one of `modes` (parameters ignored; `type/*` and `*\/*` match). */
export function acceptsMediaType(modes: readonly string[], mediaType: string): boolean {
  const essence = mediaType.split(';')[0]!.trim().toLowerCase();
  const [type] = essence.split('/');
  return modes.some((mode) => {
    const wanted = mode.split(';')[0]!.trim().toLowerCase();
    return wanted === essence || wanted === '*/*' || (wanted.endsWith('/*') && wanted.slice(0, -2) === type);
  });
}

export function agentBaseUrl(config: KeelConfig, agentId: string): string {
  return `${config.server.publicUrl}/a2a/${agentId}`;
}

export function buildAgentCard(agent: AgentConfig, config: KeelConfig, options: { extended?: boolean } = {}): Record<string, unknown> {
  const url = agentBaseUrl(config, agent.id);
  const secured = config.auth.mode === 'token';
  return {
    name: agent.name,
    description: agent.description || agent.name,
    version: agent.version,
    supportedInterfaces: [
      { url, protocolBinding: 'JSONRPC', protocolVersion: PROTOCOL_VERSION },
      { url, protocolBinding: 'HTTP+JSON', protocolVersion: PROTOCOL_VERSION },
    ],
    provider: { organization: 'Keel', url: config.server.publicUrl },
    capabilities: {
      streaming: true,
      pushNotifications: true,
      extendedAgentCard: true,
      ...(agent.extensions.length > 0 ? { extensions: agent.extensions.map((extension) => ({ uri: extension.uri, description: extension.description, required: extension.required })) } : {}),
    },
    ...(secured
      ? {
          securitySchemes: {
            bearer: { httpAuthSecurityScheme: { scheme: 'Bearer', bearerFormat: 'keel client token', description: 'A client token issued with `keel clients add <name>`' } },
          },
          securityRequirements: [{ schemes: { bearer: { list: [] } } }],
        }
      : {}),
    defaultInputModes: [...INPUT_MODES],
    defaultOutputModes: ['text/plain', 'application/json'],
    skills: agent.skills.map((skill) => ({
      id: skill.id,
      name: skill.name,
      description: skill.description || skill.name,
      tags: skill.tags,
      ...(skill.examples ? { examples: skill.examples } : {}),
    })),
    ...(options.extended ? { documentationUrl: `${config.server.publicUrl}/a2a/${agent.id}/.well-known/agent-card.json` } : {}),
  };
}
