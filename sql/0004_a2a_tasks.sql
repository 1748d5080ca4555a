-- A2A tasks: the client-facing view of runs. A task belongs to a context and to the client that
-- created it; its id is the id of its first run.
-- Context ids may come from clients, so they are text (at most 256 characters) and unique per
-- owner: two clients using the same id have two contexts, and never see each other's.
CREATE TABLE contexts (
  owner uuid NOT NULL REFERENCES clients (id),
  id text NOT NULL CHECK (length(id) BETWEEN 1 AND 256),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner, id)
);

-- A run that belongs to an A2A task knows it, so the executor can apply the A2A rules (a result
-- that cannot be retained fails the task) and the projector knows what to project.
ALTER TABLE runs ADD COLUMN task_id uuid;
-- When the run's status last changed (the A2A status timestamp).
ALTER TABLE runs ADD COLUMN status_changed_at timestamptz NOT NULL DEFAULT now();

CREATE TABLE a2a_tasks (
  id uuid PRIMARY KEY,
  context_id text NOT NULL,
  owner uuid NOT NULL REFERENCES clients (id),
  agent text NOT NULL,
  run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  -- The A2A state, kept equal to the run's status by the trigger below in the same transaction
  -- as every run transition.
  state text NOT NULL CHECK (state IN ('TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING', 'TASK_STATE_INPUT_REQUIRED',
    'TASK_STATE_AUTH_REQUIRED', 'TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED')),
  status_timestamp timestamptz NOT NULL DEFAULT now(),
  -- Sealed at the answer level: the final status message, the artifacts, the history.
  status_message bytea,
  artifacts bytea,
  history bytea,
  answer_level text NOT NULL CHECK (answer_level IN ('none', 'metadata', 'redacted', 'full')),
  metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
  -- Projection watermark: the run revision and journal sequence the view and journal reached,
  -- and the state the journal last announced.
  revision bigint NOT NULL DEFAULT 0,
  last_sequence integer NOT NULL DEFAULT 0,
  projected_state text NOT NULL DEFAULT 'TASK_STATE_SUBMITTED',
  -- The answer is presented as a direct Message rather than a task (A2A allows either).
  direct_message boolean NOT NULL DEFAULT false,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (owner, context_id) REFERENCES contexts (owner, id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX a2a_tasks_run_idx ON a2a_tasks (run_id);
-- ListTasks: newest status first, keyset (status_timestamp, id), per owner, optionally per context.
CREATE INDEX a2a_tasks_owner_list_idx ON a2a_tasks (owner, status_timestamp DESC, id DESC);
CREATE INDEX a2a_tasks_context_list_idx ON a2a_tasks (owner, context_id, status_timestamp DESC, id DESC);
CREATE INDEX a2a_tasks_created_idx ON a2a_tasks (created_at);
-- Projection debt lives only on tasks whose journal has not announced a final state yet: a run
-- revision above the task's `revision` is owed to the journal. This index keeps the sweeper's
-- search proportional to open tasks.
CREATE INDEX a2a_tasks_open_projection_idx ON a2a_tasks (run_id)
  WHERE projected_state NOT IN ('TASK_STATE_COMPLETED', 'TASK_STATE_FAILED', 'TASK_STATE_CANCELED', 'TASK_STATE_REJECTED');

-- The journal: every event a client may see, in order per task. Written only by the projector,
-- idempotently per run revision.
CREATE TABLE a2a_events (
  task_id uuid NOT NULL REFERENCES a2a_tasks (id) ON DELETE CASCADE,
  sequence integer NOT NULL,
  run_id uuid NOT NULL,
  run_revision bigint NOT NULL,
  ordinal integer NOT NULL,
  kind text NOT NULL CHECK (kind IN ('status', 'artifact', 'message')),
  -- The state the event announces (status events), for readers that must not open the payload.
  state text,
  payload bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (task_id, sequence),
  UNIQUE (run_id, run_revision, ordinal)
);

CREATE FUNCTION keel_task_state(run_status text, failure jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE run_status
    WHEN 'queued' THEN 'TASK_STATE_SUBMITTED'
    WHEN 'running' THEN 'TASK_STATE_WORKING'
    WHEN 'waiting_for_approval' THEN 'TASK_STATE_WORKING'
    WHEN 'waiting_for_dependency' THEN 'TASK_STATE_WORKING'
    WHEN 'waiting_for_input' THEN 'TASK_STATE_INPUT_REQUIRED'
    WHEN 'completed' THEN 'TASK_STATE_COMPLETED'
    WHEN 'failed' THEN CASE WHEN coalesce(failure ->> 'rejected', 'false') = 'true' THEN 'TASK_STATE_REJECTED' ELSE 'TASK_STATE_FAILED' END
    WHEN 'cancelled' THEN 'TASK_STATE_CANCELED'
  END
$$;

CREATE FUNCTION keel_sync_task_state() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.status_changed_at := now();
  IF NEW.task_id IS NOT NULL THEN
    UPDATE a2a_tasks
      SET state = keel_task_state(NEW.status, NEW.failure_detail), status_timestamp = now(), updated_at = now()
      WHERE id = NEW.task_id AND state IS DISTINCT FROM keel_task_state(NEW.status, NEW.failure_detail);
  END IF;
  RETURN NEW;
END
$$;

CREATE TRIGGER runs_sync_task_state BEFORE UPDATE OF status ON runs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION keel_sync_task_state();
