-- The push outbox: one delivery per journal event per config of the task, written by the projector
-- in the transaction that writes the event. Delivery and config lifecycles are governed by
-- machines/delivery.machine.ts and machines/push-config.machine.ts.
CREATE TABLE push_deliveries (
  id uuid PRIMARY KEY,
  task_id uuid NOT NULL,
  config_id text NOT NULL,
  event_sequence integer NOT NULL,
  -- Whether the event ends the task (a terminal status): such deliveries are never coalesced.
  terminal boolean NOT NULL DEFAULT false,
  -- A non-terminal status event, the only kind the bounds may coalesce.
  coalescible boolean NOT NULL DEFAULT false,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead', 'expired', 'cancelled', 'superseded')),
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  last_outcome text,
  deadline timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  ended_at timestamptz,
  UNIQUE (task_id, config_id, event_sequence),
  FOREIGN KEY (task_id, config_id) REFERENCES push_configs (task_id, id) ON DELETE CASCADE,
  FOREIGN KEY (task_id, event_sequence) REFERENCES a2a_events (task_id, sequence) ON DELETE CASCADE
);
-- The head of each config's queue, and the bounds' counts, come from pending rows only.
CREATE INDEX push_deliveries_pending_idx ON push_deliveries (task_id, config_id, event_sequence) WHERE state = 'pending';
CREATE INDEX push_deliveries_due_idx ON push_deliveries (next_attempt_at) WHERE state = 'pending';

CREATE TABLE push_attempts (
  delivery_id uuid NOT NULL REFERENCES push_deliveries (id) ON DELETE CASCADE,
  attempt integer NOT NULL,
  started_at timestamptz NOT NULL,
  duration_ms integer NOT NULL,
  status_code integer,
  -- 'delivered', 'retry', 'paused', 'stopped', 'dead', or the error class of a failed request.
  outcome text NOT NULL,
  error_class text,
  PRIMARY KEY (delivery_id, attempt)
);
