import type { Span } from '@opentelemetry/api';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { inInboxCallbackSpan } from '../tracing/client-spans.js';
import { tracingEnabled } from '../tracing/tracing-switch.js';
import type { KeelConfig } from '../config/load-config.js';
import type { KeelLogger } from '../log/logger.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import type { Sealer } from '../sealing/sealer.js';
import type { DatabasePool } from 'slonik';
import { credentialMatches, getRegistration, storeCallback } from './dependency-repository.js';
import { inboxJobId } from '../queue/job-ids.js';
import { MAX_JSON_DEPTH, nestsDeeperThan } from '../protocol/wire.js';
import { isUuid } from '../db/uuid.js';

// POST /a2a/inbox/:registrationId — where remote agents push their task events for Keel's own
// dependencies. Only the registration's Bearer credential is accepted (X-A2A-Notification-Token is
// ignored); no A2A-Version is required; the body must be a StreamResponse; a valid callback is
// stored durably within its bounds before the 2xx, and a worker reconciles by asking the remote.

const KINDS = ['task', 'message', 'statusUpdate', 'artifactUpdate'] as const;
const RETRY_AFTER_SECONDS = '5';

export type InboxDeps = { pool: DatabasePool; sealer: Sealer; queues: KeelQueues; config: KeelConfig; logger: KeelLogger };

/** A StreamResponse has exactly one of its four members, each an object. */
export function streamResponseKind(body: unknown): (typeof KINDS)[number] | null {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return null;
  const present = KINDS.filter((kind) => (body as Record<string, unknown>)[kind] !== undefined);
  if (present.length !== 1) return null;
  const value = (body as Record<string, unknown>)[present[0]!];
  return typeof value === 'object' && value !== null && !Array.isArray(value) ? present[0]! : null;
}

/** A request header's first value (Fastify gives a repeated header as an array). */
function headerValue(request: FastifyRequest, name: string): string | undefined {
  const value = request.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

export function registerInboxRoutes(app: FastifyInstance, deps: InboxDeps): void {
  app.post<{ Params: { registrationId: string } }>('/a2a/inbox/:registrationId', (request, reply) =>
    tracingEnabled() ? inInboxCallbackSpan(headerValue(request, 'traceparent'), headerValue(request, 'tracestate'), request.params.registrationId, async (span) => {
          const answered = await receive(request, reply, span);
          span.setAttribute('http.response.status_code', reply.statusCode);
          return answered;
        }) : receive(request, reply, null),
  );

  async function receive(request: FastifyRequest<{ Params: { registrationId: string } }>, reply: FastifyReply, span: Span | null) {
    const unauthorized = () => reply.code(401).header('www-authenticate', 'Bearer realm="keel-inbox"').send({ error: 'unauthorized' });
    const { registrationId } = request.params;
    const header = request.headers.authorization;
    const match = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!match || !isUuid(registrationId)) return unauthorized();
    const registration = await getRegistration(deps.pool, registrationId);
    if (!registration || !credentialMatches(match[1]!, registration.credential_hash)) return unauthorized();
    span?.setAttribute('keel.dependency.id', registration.dependency_id);

    let body: unknown;
    try {
      body = JSON.parse(String(request.body ?? ''));
    } catch {
      return reply.code(400).send({ error: 'the body is not JSON' });
    }
    // Sealing stringifies the body: one nested thousands of levels deep overflowed the stack (a 500).
    if (nestsDeeperThan(body, MAX_JSON_DEPTH)) return reply.code(400).send({ error: `the body nests deeper than ${MAX_JSON_DEPTH} levels` });
    const kind = streamResponseKind(body);
    if (!kind) return reply.code(400).send({ error: 'the body is not a StreamResponse (exactly one of task, message, statusUpdate, artifactUpdate)' });

    const stored = await storeCallback(deps.pool, deps.sealer, registrationId, kind, body, {
      perRegistration: deps.config.inbox.maxPendingPerRegistration,
      total: deps.config.inbox.maxPendingTotal,
    });
    if (!stored.ok) {
      return reply.code(429).header('retry-after', RETRY_AFTER_SECONDS).send({ error: stored.reason === 'registration_full' ? 'too many unprocessed callbacks for this registration' : 'the inbox is full' });
    }
    // Stored: 2xx means received. The reconcile job is a wake-up; the poller repairs a lost one.
    await deps.queues.ensureJob('inbox', inboxJobId(registration.dependency_id), { dependencyId: registration.dependency_id }).catch((error: Error) =>
      deps.logger.warn({ err: error, dependencyId: registration.dependency_id }, 'reconcile job not enqueued; the poller will reconcile'),
    );
    return reply.code(200).send({ received: true });
  }
}
