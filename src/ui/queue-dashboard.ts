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
  await scope.register(serverAdapter.registerPlugin() as never, { prefix: '/queues' });
}
