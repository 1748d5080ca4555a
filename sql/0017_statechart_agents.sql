-- Statechart agents (docs/statechart-agents.md, docs/decisions/0027-statechart-agents.md): an
-- agent written as an XState machine drives its run, and every transition commits the machine's
-- snapshot (sealed, in runs.suspended_state, which holds a run's durable state).

-- Which definition a run of a statechart agent runs (a hash of the machine's definition, set at its
-- first transition and kept), and the state it stands in now (the state names of the definition,
-- not content: the machines page counts runs per state from it).
ALTER TABLE runs ADD COLUMN machine_hash text;
ALTER TABLE runs ADD COLUMN machine_state jsonb;

-- A durable `after`: the run waits for a due time and a delayed job (restored by the sweep) wakes
-- it, in waiting_for_timer, or while it waits for someone (input, an approval, a remote agent)
-- when its machine also waits for a timer there. Set with every suspension (NULL: no timer).
ALTER TABLE runs ADD COLUMN timer_due_at timestamptz;
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_status_check;
ALTER TABLE runs ADD CONSTRAINT runs_status_check CHECK (status IN (
  'queued', 'running', 'waiting_for_approval', 'waiting_for_input', 'waiting_for_dependency',
  'waiting_for_timer', 'completed', 'failed', 'cancelled'));

CREATE OR REPLACE FUNCTION keel_task_state(run_status text, failure jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE run_status
    WHEN 'queued' THEN 'TASK_STATE_SUBMITTED'
    WHEN 'running' THEN 'TASK_STATE_WORKING'
    WHEN 'waiting_for_approval' THEN 'TASK_STATE_WORKING'
    WHEN 'waiting_for_dependency' THEN 'TASK_STATE_WORKING'
    WHEN 'waiting_for_timer' THEN 'TASK_STATE_WORKING'
    WHEN 'waiting_for_input' THEN 'TASK_STATE_INPUT_REQUIRED'
    WHEN 'completed' THEN 'TASK_STATE_COMPLETED'
    WHEN 'failed' THEN CASE WHEN coalesce(failure ->> 'rejected', 'false') = 'true' THEN 'TASK_STATE_REJECTED' ELSE 'TASK_STATE_FAILED' END
    WHEN 'cancelled' THEN 'TASK_STATE_CANCELED'
  END
$$;

-- A status message the machine showed on entering a state (meta.status) is a run output like an
-- emitted artifact; the journal shows it as a WORKING status update.
ALTER TABLE run_outputs DROP CONSTRAINT IF EXISTS run_outputs_kind_check;
ALTER TABLE run_outputs ADD CONSTRAINT run_outputs_kind_check CHECK (kind IN ('artifact', 'answer', 'status'));

-- The path a run took through its machine: one row per committed transition, the state it
-- reached (state names only), for the run's page.
CREATE TABLE run_machine_steps (
  run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  sequence integer NOT NULL,
  state jsonb NOT NULL,
  event text NOT NULL,
  machine_hash text NOT NULL,
  at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, sequence)
);

-- Every definition of a statechart agent a process started with, by hash: `keel machines diff`
-- compares the definitions runs in flight started with against the current one.
CREATE TABLE machine_definitions (
  agent text NOT NULL,
  hash text NOT NULL,
  definition jsonb NOT NULL,
  first_seen_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (agent, hash)
);
