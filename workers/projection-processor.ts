import type { Job } from 'bullmq';
import type { ProjectionOptions } from '../src/tasks/journal-writer.js';
import { projectRun, type ProjectionResult } from '../src/tasks/task-projector.js';
import type { KeelContext } from '../src/context/keel-context.js';

// The projector queue's processor: a wake-up for a run whose committed revisions are not all in
// the journal yet (restored by the sweeper after a crash or a lost job). Projection is idempotent
// per revision, so a duplicate job does nothing.
export function createProjectorProcessor(
  context: Pick<KeelContext, 'pool' | 'sealer'>,
  options: ProjectionOptions,
  afterProjection: (result: ProjectionResult) => Promise<void>,
) {
  return async (job: Job<{ runId: string }>) => {
    const result = await projectRun(context.pool, context.sealer, job.data.runId, options);
    await afterProjection(result);
    return { events: result.events, revision: result.revision, deliveries: result.deliveryIds.length };
  };
}
