import { createHash } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AgentRegistry } from '../agents/agent-registry.js';
import { headerValue } from './binding-support.js';
import type { ServedCards } from './served-cards.js';

// The public agent cards: the default agent's at /.well-known/agent-card.json and each agent's at
// /a2a/<agent>/.well-known/agent-card.json, cacheable and revalidated by ETag or Last-Modified.
// With card signing on, each carries its signature, and /.well-known/jwks.json serves the public
// key that checks it (decision 0021).

export type CardRouteDeps = { registry: AgentRegistry; cards: ServedCards };

export function registerCardRoutes(app: FastifyInstance, deps: CardRouteDeps): void {
  const { registry, cards } = deps;
  const startedAt = new Date();
  startedAt.setMilliseconds(0);
  // Built on first use: with port 0 the public URL is only known once the server listens.
  const bodies = new Map<string, Promise<{ body: string; etag: string }>>();
  const cardOf = (id: string) => {
    const agent = registry.get(id);
    if (!agent) return null;
    let card = bodies.get(id);
    if (!card) {
      card = cards.card(agent.config).then((built) => {
        const body = JSON.stringify(built);
        return { body, etag: `"${createHash('sha256').update(body).digest('base64url').slice(0, 27)}"` };
      });
      card.catch(() => bodies.delete(id));
      bodies.set(id, card);
    }
    return card;
  };

  const sendCard = async (request: FastifyRequest, reply: FastifyReply, agentId: string) => {
    const pending = cardOf(agentId);
    if (!pending) return reply.code(404).type('application/json').send({ error: { code: 404, status: 'NOT_FOUND', message: `no agent ${agentId}` } });
    const card = await pending;
    reply
      .header('cache-control', 'public, max-age=300')
      .header('etag', card.etag)
      .header('last-modified', startedAt.toUTCString());
    const match = headerValue(request, 'if-none-match');
    const since = headerValue(request, 'if-modified-since');
    if ((match !== undefined && match.split(',').some((tag) => tag.trim() === card.etag || tag.trim() === '*')) || (match === undefined && since !== undefined && Date.parse(since) >= startedAt.getTime())) {
      return reply.code(304).send();
    }
    return reply.type('application/json').send(card.body);
  };
  app.get('/.well-known/agent-card.json', (request, reply) => sendCard(request, reply, registry.defaultAgentId));
  app.get<{ Params: { agent: string } }>('/a2a/:agent/.well-known/agent-card.json', (request, reply) => sendCard(request, reply, request.params.agent));
  app.get('/.well-known/jwks.json', (_request, reply) => {
    const jwks = cards.jwks();
    if (!jwks) return reply.code(404).type('application/json').send({ error: { code: 404, status: 'NOT_FOUND', message: 'card signing is not configured (security.cardSigning)' } });
    return reply.header('cache-control', 'public, max-age=300').type('application/jwk-set+json').send(JSON.stringify(jwks));
  });
}
