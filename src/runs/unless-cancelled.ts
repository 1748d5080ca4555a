// A step of a run (a tool call, a model call, a statechart step) raced against the run's cancel:
// the executor stops waiting for it as soon as the run is cancelled, whether the step honours its
// AbortSignal or not, and whatever it still answers is discarded, never applied
// (docs/decisions/0066-cancellation-reaches-the-work.md).

export type Raced<T> = { done: true; value: T } | { done: false };

/** What a step answered after its run was cancelled, for the timeline (meta only, no content). */
export type LateOutcome = { outcome: string; dependencyId?: string };

/** Takes a step's late answer: records it as discarded once the run's stop is written. */
export type DiscardLate = (late: Promise<LateOutcome>, meta: Record<string, unknown>) => void;

/** The step's value, or `{ done: false }` as soon as `cancelled` aborts (at once if it already has). */
export function unlessCancelled<T>(work: Promise<T>, cancelled: AbortSignal): Promise<Raced<T>> {
  if (cancelled.aborted) return Promise.resolve({ done: false });
  return new Promise<Raced<T>>((resolve, reject) => {
    const onCancel = () => resolve({ done: false });
    cancelled.addEventListener('abort', onCancel, { once: true });
    work.then(
      (value) => {
        cancelled.removeEventListener('abort', onCancel);
        resolve({ done: true, value });
      },
      (error: unknown) => {
        cancelled.removeEventListener('abort', onCancel);
        reject(error);
      },
    );
  });
}

/** The step started as a promise, so a step that throws before its first await is raced the same way. */
export const started = <T>(step: () => Promise<T>): Promise<T> => Promise.resolve().then(step);
