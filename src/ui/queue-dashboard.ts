import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { FastifyAdapter } from '@bull-board/fastify';
import type { FastifyInstance } from 'fastify';
import type { KeelQueues } from '../queue/keel-queues.js';

// The BullMQ dashboard (bull-board) at /ui/queues over every Keel queue, on either backend: with
// BullMQ 6 bull-board reads a Postgres-backed queue through the queue's own backend as it reads
// Redis. It is registered read-only: a job is only a wake-up whose truth is in Postgres (the
// sweeper re-adds any that is missing), and the dashboard's own buttons could not carry Keel's
// CSRF token; the UI's guard refuses its state-changing requests as well.

export const QUEUE_DASHBOARD_PATH = '/ui/queues';

/**
 * The dashboard page's Content-Security-Policy: its own scripts, styles and images only (bull-board
 * renders inline styles; its config block is JSON, never run), requests to this origin only.
 */
export const QUEUE_DASHBOARD_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'self'";

/** bull-board's page links web fonts from a public host: Keel serves nothing from elsewhere (and works offline), so the links go and the system fonts show. */
export function withoutExternalLinks(html: string): string {
  return html.replace(/<link\b[^>]*\bhref="(?:https?:)?\/\/[^"]*"[^>]*>\s*/gi, '');
}

export async function registerQueueDashboard(scope: FastifyInstance, queues: KeelQueues): Promise<void> {
  const serverAdapter = new FastifyAdapter();
  serverAdapter.setBasePath(QUEUE_DASHBOARD_PATH);
  createBullBoard({
    queues: queues.allQueues().map(
      (queue) =>
        new BullMQAdapter(queue as never, {
          readOnlyMode: true,
          allowRetries: false,
          description: `Keel's ${queue.name} queue on the ${queues.backend.kind} backend (read-only: jobs are wake-ups; Postgres holds the work)`,
        }),
    ),
    serverAdapter,
    options: {
      uiConfig: {
        boardTitle: 'Keel queues',
        hideDocsLink: true,
        miscLinks: [
          { text: 'Keel operator UI', url: '/ui/machines' },
          { text: 'Log out', url: '/ui/logout' },
        ],
      },
    },
  });
  await scope.register(async (dashboard) => {
    dashboard.addHook('onSend', async (_request, reply, payload) => {
      const type = reply.getHeader('content-type');
      if (typeof type !== 'string' || !type.startsWith('text/html')) return payload;
      reply.header('content-security-policy', QUEUE_DASHBOARD_CSP);
      return typeof payload === 'string' ? withoutExternalLinks(payload) : payload;
    });
    await dashboard.register(serverAdapter.registerPlugin() as never, { prefix: '/queues' });
  });
}
