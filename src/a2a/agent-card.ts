import type { AgentConfig } from '../config/config-schema.js';
import type { KeelConfig } from '../config/load-config.js';
import { SEQUENCED_EVENTS_EXTENSION } from './sequenced-events.js';

// An agent's card, built from its config. The HTTP bindings share one base URL: JSON-RPC posts to it,
// HTTP+JSON appends the specification's paths. The gRPC binding, when on, is one `host:port` for
// every agent, and the interface's `tenant` names the agent (decision 0020). Capabilities are
// declared as they are.

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

/** `host:port`, an IPv6 host in brackets: how gRPC names an address to bind or dial. */
export const hostPort = (host: string, port: number) => `${host.includes(':') ? `[${host}]` : host}:${port}`;

/**
 * The gRPC target the cards name (`host:port`, as the official clients dial it), or null when the
 * gRPC binding is off. A wildcard bind is named by loopback, as the HTTP public URL is.
 */
export function grpcPublicAddress(config: KeelConfig): string | null {
  const { port, host, publicAddress } = config.grpc;
  if (port === undefined) return null;
  if (publicAddress) return publicAddress;
  const bind = host ?? config.server.host;
  return hostPort(bind === '0.0.0.0' || bind === '::' ? '127.0.0.1' : bind, port);
}

export function buildAgentCard(agent: AgentConfig, config: KeelConfig, options: { extended?: boolean } = {}): Record<string, unknown> {
  const url = agentBaseUrl(config, agent.id);
  const secured = config.auth.mode === 'token';
  const grpc = grpcPublicAddress(config);
  return {
    name: agent.name,
    description: agent.description || agent.name,
    version: agent.version,
    supportedInterfaces: [
      { url, protocolBinding: 'JSONRPC', protocolVersion: PROTOCOL_VERSION },
      { url, protocolBinding: 'HTTP+JSON', protocolVersion: PROTOCOL_VERSION },
      // Last, so a client that takes the first interface it can speak keeps to HTTP.
      ...(grpc ? [{ url: grpc, protocolBinding: 'GRPC', protocolVersion: PROTOCOL_VERSION, tenant: agent.id }] : []),
    ],
    provider: { organization: 'Keel', url: config.server.publicUrl },
    capabilities: {
      streaming: true,
      pushNotifications: true,
      extendedAgentCard: true,
      // Keel's own extension, which every agent supports, after the agent's.
      extensions: [...agent.extensions.map((extension) => ({ uri: extension.uri, description: extension.description, required: extension.required })), { ...SEQUENCED_EVENTS_EXTENSION }],
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
