-- Runs: the durable agent loop. Status transitions are governed by machines/run.machine.ts; the
-- checks below repeat its vocabulary so no writer can store a state the machine does not know.
CREATE TABLE runs (
  id uuid PRIMARY KEY,
  agent text NOT NULL,
  status text NOT NULL DEFAULT 'queued' CHECK (status IN (
    'queued', 'running', 'waiting_for_approval', 'waiting_for_input', 'waiting_for_dependency',
    'completed', 'failed', 'cancelled')),
  termination_reason text CHECK (termination_reason IN (
    'completed', 'max_iterations', 'budget_exhausted', 'policy_denied', 'approval_denied',
    'provider_failed', 'retries_exhausted', 'not_retryable', 'result_not_retainable', 'cancelled')),
  truncated boolean NOT NULL DEFAULT false,
  revision bigint NOT NULL DEFAULT 1,
  claimed_by text,
  lease_expires_at timestamptz,
  requeue_count integer NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  audit_level text NOT NULL CHECK (audit_level IN ('none', 'metadata', 'redacted', 'full')),
  answer_level text NOT NULL CHECK (answer_level IN ('none', 'metadata', 'redacted', 'full')),
  queued_request bytea,
  suspended_state bytea,
  iterations integer NOT NULL DEFAULT 0,
  tool_calls integer NOT NULL DEFAULT 0,
  input_tokens bigint NOT NULL DEFAULT 0,
  output_tokens bigint NOT NULL DEFAULT 0,
  error_class text,
  -- Set while the run is inside a non-idempotent tool call: a run reaped in that window is
  -- dead-lettered, never retried.
  inside_non_idempotent_call text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  settled_at timestamptz,
  CONSTRAINT runs_reason_iff_terminal CHECK (
    (status IN ('completed', 'failed', 'cancelled')) = (termination_reason IS NOT NULL)),
  CONSTRAINT runs_reason_matches_status CHECK (
    termination_reason IS NULL
    OR (status = 'completed' AND termination_reason IN ('completed', 'max_iterations', 'budget_exhausted'))
    OR (status = 'failed' AND termination_reason IN ('policy_denied', 'approval_denied', 'provider_failed',
        'retries_exhausted', 'not_retryable', 'result_not_retainable'))
    OR (status = 'cancelled' AND termination_reason = 'cancelled')),
  CONSTRAINT runs_lease_only_when_running CHECK (status = 'running' OR lease_expires_at IS NULL)
);

-- The sweeper and workers look for claimable and expired work; partial indexes keep those scans
-- proportional to the work outstanding, not to history.
CREATE INDEX runs_queued_idx ON runs (available_at, id) WHERE status = 'queued';
CREATE INDEX runs_lease_idx ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_waiting_idx ON runs (status, updated_at) WHERE status IN ('waiting_for_approval', 'waiting_for_input', 'waiting_for_dependency');
CREATE INDEX runs_created_idx ON runs (created_at DESC, id DESC);

CREATE TABLE run_events (
  run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  sequence integer NOT NULL,
  kind text NOT NULL,
  payload jsonb NOT NULL DEFAULT '{}'::jsonb,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, sequence)
);

-- Master keys that have sealed values in this database. A key stays listed (not retired) while any
-- value may still be wrapped by it; start-up refuses to run without every such key.
CREATE TABLE sealing_keys (
  key_id text PRIMARY KEY,
  created_at timestamptz NOT NULL DEFAULT now(),
  retired_at timestamptz
);
