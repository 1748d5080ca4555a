import { context, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Context, type Link, type SpanContext } from '@opentelemetry/api';
import { inSpan, keelTracer } from './keel-tracer.js';
import { startSpanWithId } from './requested-span-id.js';
import { formatTraceparent, newSpanId, parseTraceparent } from './trace-context.js';
import { tracingEnabled } from './tracing-switch.js';

// A run's place in its task's trace (docs/decisions/0082-a-run-span-outlives-its-process.md). A
// run outlives the process that created it: its span id is chosen at creation and stored on the
// run's row (sql/0030) with its trace id and its parent (the A2A request that created the task);
// each stretch a worker executes it is a span parented to that id, whichever process and however
// many restarts later; the `invoke_agent` span itself is started when the run settles, with its
// creation as its start and the stored id as its own.

/** A run's trace as its row stores it. */
export type RunTrace = {
  /** The run span's traceparent: the task's trace id, the run span's id, the sampled flag. */
  context: string;
  /** The span the run span is a child of (the A2A request's server span). */
  parentSpanId: string;
  /** The incoming tracestate, carried on. */
  state: string | null;
};

/** The trace columns of a run row. */
export type RunTraceColumns = { trace_context?: string | null | undefined; trace_parent_span?: string | null | undefined; trace_state?: string | null | undefined };

/**
 * The trace of a run created now, under the active span (the A2A request's), or null while tracing
 * is off or without a span to belong to.
 */
export function newRunTrace(): RunTrace | null {
  if (!tracingEnabled()) return null;
  const parent = trace.getSpanContext(context.active());
  if (!parent || !trace.isSpanContextValid(parent)) return null;
  const state = parent.traceState?.serialize();
  return {
    context: formatTraceparent({ traceId: parent.traceId, spanId: newSpanId(), traceFlags: parent.traceFlags }),
    parentSpanId: parent.spanId,
    state: state ? state : null,
  };
}

/** The run span's context from its row, or null for a run stored without one. */
export function runSpanContext(row: RunTraceColumns): SpanContext | null {
  return parseTraceparent(row.trace_context ?? undefined, row.trace_state ?? undefined);
}

/** The context whose active span is the run's span (its stretches, tool and model calls parent to it); the root context for a run stored without one. */
export function runContext(row: RunTraceColumns): Context {
  const own = runSpanContext(row);
  return own ? trace.setSpanContext(ROOT_CONTEXT, own) : ROOT_CONTEXT;
}

/** A link to a run's span (a batch that carried its task's write). */
export function runLink(row: RunTraceColumns): Link | null {
  const own = runSpanContext(row);
  return own ? { context: own } : null;
}

/** What the `invoke_agent` span says of a run. */
export type SettledRun = RunTraceColumns & { id: string; agent: string; task_id: string | null; created_at: number };

/**
 * The run's `invoke_agent` span, recorded when the run settled: started at the run's creation,
 * with the span id stored at creation (so the stretches, exported long before, are its children).
 */
export function recordRunSpan(run: SettledRun, outcome: { status: string; failed: boolean }): void {
  if (!tracingEnabled()) return;
  const own = runSpanContext(run);
  if (!own || !run.trace_parent_span) return;
  const parent = trace.setSpanContext(ROOT_CONTEXT, { traceId: own.traceId, spanId: run.trace_parent_span, traceFlags: own.traceFlags, isRemote: true, ...(own.traceState ? { traceState: own.traceState } : {}) });
  const span = startSpanWithId(own.spanId, () =>
    keelTracer().startSpan(
      `invoke_agent ${run.agent}`,
      {
        kind: SpanKind.INTERNAL,
        startTime: run.created_at,
        attributes: {
          'gen_ai.operation.name': 'invoke_agent',
          'gen_ai.agent.id': run.agent,
          'gen_ai.agent.name': run.agent,
          'keel.run.id': run.id,
          ...(run.task_id ? { 'keel.task.id': run.task_id } : {}),
          'keel.run.status': outcome.status,
        },
      },
      parent,
    ),
  );
  if (outcome.failed) span.setStatus({ code: SpanStatusCode.ERROR, message: outcome.status });
  span.end();
}

/** What a stretch's span says of the run a worker holds. */
export type HeldRunTrace = SettledRun & { revision: number; requeue_count: number };

/** How a stretch ended, as the executor reports it. */
export type StretchEnd = { kind: string; status?: string; reason?: string; why?: string };

/**
 * One stretch a worker executes a run (claim to settle, suspension or stop): a span parented to the
 * run's stored span, and when the stretch settled the run, the run's `invoke_agent` span.
 * `keel.run.stretch` is the run's revision when this stretch claimed it: it grows with each
 * stretch (and with each other change of the run), so stretches sort by it.
 */
export async function inRunStretch<T extends StretchEnd>(run: HeldRunTrace, workerId: string, work: () => Promise<T>): Promise<T> {
  const report = await inSpan(
    'keel.run.stretch',
    {
      kind: SpanKind.INTERNAL,
      attributes: {
        'gen_ai.agent.id': run.agent,
        'keel.run.id': run.id,
        ...(run.task_id ? { 'keel.task.id': run.task_id } : {}),
        'keel.worker.id': workerId,
        'keel.run.stretch': run.revision,
        'keel.run.requeues': run.requeue_count,
      },
    },
    runContext(run),
    async (span) => {
      const ended = await work();
      span.setAttribute('keel.run.outcome', ended.kind);
      return ended;
    },
  );
  if (report.kind === 'settled' && report.status !== undefined) recordRunSpan(run, { status: report.status, failed: report.status !== 'completed' });
  else if (report.kind === 'stopped' && report.why === 'cancelled') recordRunSpan(run, { status: 'cancelled', failed: false });
  return report;
}

/** A link to the span of a run about to be created (a creation a batch writes), naming its task. */
export function newRunLink(stored: RunTrace | null | undefined, taskId: string): Link | null {
  if (!stored) return null;
  const own = parseTraceparent(stored.context, stored.state ?? undefined);
  return own ? { context: own, attributes: { 'keel.task.id': taskId } } : null;
}
