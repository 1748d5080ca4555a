import type { DatabasePool } from 'slonik';
import type { KeelLogger } from '../log/logger.js';
import { inboxJobId } from '../queue/job-ids.js';
import type { KeelQueues } from '../queue/keel-queues.js';
import { dueOpenDependenciesOfRun } from './dependency-repository.js';

/**
 * After a run was cancelled: each remote task it started and still waits on is cancelled in turn,
 * through its dependency's reconcile (src/remote/reconcile.ts, CancelTask as the agent's own
 * client), enqueued now. The dependencies are made due first, so a lost wake-up is repaired by the
 * poller's next sweep (decision 0066).
 */
export async function cancelRemoteChildren(deps: { pool: DatabasePool; queues: KeelQueues; logger: KeelLogger }, runId: string): Promise<void> {
  try {
    for (const dependencyId of await dueOpenDependenciesOfRun(deps.pool, runId)) {
      await deps.queues.ensureJob('inbox', inboxJobId(dependencyId), { dependencyId });
    }
  } catch (error) {
    deps.logger.warn({ err: error, runId }, 'the remote tasks of a cancelled run could not be woken now; the poller cancels them');
  }
}
