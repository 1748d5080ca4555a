import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, RestTransportFactory, type Client } from '@a2a-js/sdk/client';
import { SendMessageRequest } from '@a2a-js/sdk';

// The official @a2a-js/sdk client as the test peer, over HTTP, with a Keel client token.

export type Binding = 'JSONRPC' | 'HTTP+JSON';

export function bearerFetch(token: string | null): typeof fetch {
  return (input, init) => {
    const headers = new Headers(init?.headers);
    if (token) headers.set('authorization', `Bearer ${token}`);
    return fetch(input, { ...init, headers });
  };
}

/** A client for one agent of a Keel at `baseUrl`, reading its card like any remote client. */
export async function sdkClient(baseUrl: string, agentId: string, token: string | null, binding: Binding = 'JSONRPC'): Promise<Client> {
  const fetchImpl = bearerFetch(token);
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl }), new RestTransportFactory({ fetchImpl })],
      preferredTransports: [binding],
    }),
  );
  return factory.createFromUrl(`${baseUrl}/a2a/${agentId}/.well-known/agent-card.json`, '');
}

/** A SendMessage request built the way the SDK wants it (from JSON, so enums are right). */
export function textMessage(text: string, extra: { contextId?: string; taskId?: string; messageId?: string; returnImmediately?: boolean; historyLength?: number } = {}) {
  return SendMessageRequest.fromJSON({
    message: {
      messageId: extra.messageId ?? `m-${Math.random().toString(36).slice(2)}`,
      role: 'ROLE_USER',
      parts: [{ text }],
      ...(extra.contextId ? { contextId: extra.contextId } : {}),
      ...(extra.taskId ? { taskId: extra.taskId } : {}),
    },
    ...(extra.returnImmediately !== undefined || extra.historyLength !== undefined
      ? { configuration: { returnImmediately: extra.returnImmediately ?? false, ...(extra.historyLength !== undefined ? { historyLength: extra.historyLength } : {}) } }
      : {}),
  });
}
