-- The messageId of the message a dependency's remote task was created by, written with the pending
-- dependency before the message is sent. A sender that dies after sending never stores the remote
-- task id; a callback then names a candidate, and the id is adopted only when GetTask (as the
-- agent's own client) answers a task whose history holds this messageId (docs/client-role.md,
-- docs/decisions/0015-adopt-a-remote-task-only-by-its-message-id.md). NULL for dependencies sent
-- before this column existed: those are never adopted and fall to the give-up rule.
ALTER TABLE dependencies ADD COLUMN message_id text;
