-- Push notification configs of A2A tasks (CreateTaskPushNotificationConfig, or embedded in
-- SendMessage). No update: a change is a new config and a deletion. Credentials and token are
-- sealed; deleted configs are kept (deleted_at) so an in-flight delivery can tell it was deleted.
CREATE TABLE push_configs (
  task_id uuid NOT NULL REFERENCES a2a_tasks (id) ON DELETE CASCADE,
  id text NOT NULL CHECK (length(id) BETWEEN 1 AND 256),
  owner uuid NOT NULL REFERENCES clients (id),
  url text NOT NULL,
  token bytea,
  token_hint text,
  auth_scheme text,
  credentials bytea,
  credentials_hint text,
  state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'paused', 'stopped')),
  state_reason text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  deleted_at timestamptz,
  PRIMARY KEY (task_id, id)
);
CREATE INDEX push_configs_state_idx ON push_configs (state) WHERE deleted_at IS NULL;
