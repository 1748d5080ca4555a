-- The client role: a run that delegated to a remote A2A agent waits on a dependency; the remote's
-- callbacks arrive in an authenticated, bounded inbox; a worker reconciles by asking the remote.
CREATE TABLE remote_cards (
  remote_agent text PRIMARY KEY,
  card jsonb,
  fetched_at timestamptz,
  error text,
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dependencies (
  id uuid PRIMARY KEY,
  run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  tool_call_id text NOT NULL,
  tool_name text NOT NULL,
  remote_agent text NOT NULL,
  -- machines/dependency.machine.ts
  state text NOT NULL CHECK (state IN ('pending', 'waiting', 'resolved', 'failed')),
  remote_task_id text,
  remote_context_id text,
  -- The remote task's outcome as the tool result the run resumes with (sealed).
  result bytea,
  outcome text,
  polls integer NOT NULL DEFAULT 0,
  next_poll_at timestamptz NOT NULL DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  resolved_at timestamptz,
  UNIQUE (run_id, tool_call_id)
);
CREATE INDEX dependencies_open_idx ON dependencies (next_poll_at) WHERE state IN ('pending', 'waiting');

-- One registration per dependency whose remote supports push: its own random callback credential,
-- stored hashed, handed to the remote in `authentication` (Bearer).
CREATE TABLE inbox_registrations (
  id uuid PRIMARY KEY,
  dependency_id uuid NOT NULL REFERENCES dependencies (id) ON DELETE CASCADE,
  credential_hash bytea NOT NULL,
  remote_config_id text,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbox_registrations_dependency_idx ON inbox_registrations (dependency_id);

-- Callbacks received: stored before the 2xx, bounded per registration and in total. The body is
-- kept (sealed) for the record; it decides nothing.
CREATE TABLE inbox_callbacks (
  id uuid PRIMARY KEY,
  registration_id uuid NOT NULL REFERENCES inbox_registrations (id) ON DELETE CASCADE,
  body bytea NOT NULL,
  kind text NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  processed_at timestamptz
);
CREATE INDEX inbox_callbacks_unprocessed_idx ON inbox_callbacks (registration_id) WHERE processed_at IS NULL;
