-- Which tasks a stream has watched (docs/decisions/0047-a-fast-run-ends-without-notify-unless-watched.md).
-- Every statement here may run again on a database that already has it.

-- A fast run's end is committed by the process that ran it, which wakes its own waiters itself;
-- a NOTIFY is only needed for a stream, possibly in another process. A stream sets `watched`
-- before it reads the journal, and the held completion, which locks the task row, NOTIFYs the
-- tasks it finds watched. Not indexed: set once per streamed task, read only under that lock.
ALTER TABLE a2a_tasks ADD COLUMN IF NOT EXISTS watched boolean NOT NULL DEFAULT false;
