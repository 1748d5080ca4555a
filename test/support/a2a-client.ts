import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, RestTransportFactory, type CallInterceptor, type Client } from '@a2a-js/sdk/client';
import { GrpcTransportFactory } from '@a2a-js/sdk/client/grpc';
import { SendMessageRequest } from '@a2a-js/sdk';

// The official @a2a-js/sdk client as the test peer, over HTTP or gRPC, with a Keel client token.

export type Binding = 'JSONRPC' | 'HTTP+JSON' | 'GRPC';

export function bearerFetch(token: string | null): typeof fetch {
  return (input, init) => {
    const headers = new Headers(init?.headers);
    if (token) headers.set('authorization', `Bearer ${token}`);
    return fetch(input, { ...init, headers });
  };
}

/**
 * Sends the token as `authorization` metadata on gRPC calls (the SDK's gRPC transport has no fetch
 * to wrap; service parameters become metadata).
 */
export function bearerInterceptor(token: string | null): CallInterceptor {
  return {
    before: async (args) => {
      if (token) args.options = { ...args.options, serviceParameters: { ...args.options?.serviceParameters, authorization: `Bearer ${token}` } };
    },
    after: async () => undefined,
  };
}

/** A client for one agent of a Keel at `baseUrl`, reading its card like any remote client. */
export async function sdkClient(baseUrl: string, agentId: string, token: string | null, binding: Binding = 'JSONRPC'): Promise<Client> {
  const fetchImpl = bearerFetch(token);
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl }), new RestTransportFactory({ fetchImpl }), new GrpcTransportFactory()],
      preferredTransports: [binding],
      ...(binding === 'GRPC' ? { clientConfig: { interceptors: [bearerInterceptor(token)] } } : {}),
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
