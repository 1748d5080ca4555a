import { createHash } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { KeelConfig } from '../config/load-config.js';
import { buildAgentCard } from './agent-card.js';
import { headerValue } from './binding-support.js';

// The public agent cards: the default agent's at /.well-known/agent-card.json and each agent's at
// /a2a/<agent>/.well-known/agent-card.json, cacheable and revalidated by ETag or Last-Modified.

export type CardRouteDeps = { registry: AgentRegistry; config: KeelConfig };

export function registerCardRoutes(app: FastifyInstance, deps: CardRouteDeps): void {
  const { registry, config } = deps;
  const startedAt = new Date();
  startedAt.setMilliseconds(0);
  // Built on first use: with port 0 the public URL is only known once the server listens.
  const cards = new Map<string, { body: string; etag: string }>();
  const cardOf = (id: string) => {
    let card = cards.get(id);
    const agent = registry.get(id);
    if (!card && agent) {
      const body = JSON.stringify(buildAgentCard(agent.config, config));
      card = { body, etag: `"${createHash('sha256').update(body).digest('base64url').slice(0, 27)}"` };
      cards.set(id, card);
    }
    return card;
  };

  const sendCard = (request: FastifyRequest, reply: FastifyReply, agentId: string) => {
    const card = cardOf(agentId);
    if (!card) return reply.code(404).type('application/json').send({ error: { code: 404, status: 'NOT_FOUND', message: `no agent ${agentId}` } });
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
}
