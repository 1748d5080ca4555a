-- Traces (docs/observability.md, "Trace spans"; decisions 0081 and 0082).
-- Every statement here may run again on a database that already has it.

-- A run's place in its task's trace, written with the run while tracing is on (NULL otherwise, and
-- for runs created before this migration): the run span's W3C traceparent (the task's trace id,
-- the span id chosen for the run at creation, the sampled flag), the span id of its parent (the
-- A2A request that created the task) and the incoming tracestate. A worker that picks the run up,
-- after a requeue, a restart or a crash too, parents its spans to the stored run span, so one task
-- is one trace. A task's trace is its run's: a task's id is its run's id.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS trace_context text;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS trace_parent_span text;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS trace_state text;
