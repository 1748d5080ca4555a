-- Operator recovery (docs/operator.md, "Recovering runs"; docs/decisions/0079 and 0080): every
-- committed transition of a statechart run keeps the run's durable state as it was right after it
-- (sealed like runs.suspended_state, under its own context), so an operator can retry a failed run
-- from its last committed state or from an earlier state the run passed through. NULL for rows
-- written before this migration: a retry cannot start from them.
-- Every statement here may run again on a database that already has it.
ALTER TABLE run_machine_steps ADD COLUMN IF NOT EXISTS restore_point bytea;
