-- Idempotent SendMessage (docs/decisions/0064-idempotent-messages-decided-at-insert.md).
-- Every statement here may run again on a database that already has it.

-- A message is named by its owning client and its key: the messageId, or the Idempotency-Key the
-- client sent with it. The key of the message that created a task lives on the task's row, so the
-- creation's own INSERT decides a repeat (ON CONFLICT DO NOTHING on the unique index below) and the
-- key goes when the task goes (retention). The fingerprint is a keyed hash of what the request
-- asked (src/a2a/message-fingerprint.ts): a repeat with another body is refused, and the row holds
-- nothing of the message's content. Tasks created before this migration, and those created by
-- Keel itself, have no key.
ALTER TABLE a2a_tasks ADD COLUMN IF NOT EXISTS message_key text;
ALTER TABLE a2a_tasks ADD COLUMN IF NOT EXISTS message_fingerprint bytea;
CREATE UNIQUE INDEX IF NOT EXISTS a2a_tasks_message_key_idx ON a2a_tasks (owner, message_key) WHERE message_key IS NOT NULL;

-- The keys of follow-up messages (input to a task that asked for it), written in the transaction
-- that hands the input to the run: a repeat conflicts there and provides nothing. `after_sequence`
-- is where the follow-up's stream began, so a repeat's stream starts at the same place.
CREATE TABLE IF NOT EXISTS a2a_follow_up_keys (
  owner uuid NOT NULL,
  message_key text NOT NULL,
  task_id uuid NOT NULL REFERENCES a2a_tasks (id) ON DELETE CASCADE,
  fingerprint bytea NOT NULL,
  after_sequence integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner, message_key)
);
CREATE INDEX IF NOT EXISTS a2a_follow_up_keys_task_idx ON a2a_follow_up_keys (task_id);
