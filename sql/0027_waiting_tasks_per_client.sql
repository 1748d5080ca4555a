-- Fair run slots (docs/decisions/0062-fair-run-slots.md): a new task's run job is ordered by its
-- client's rank in its own backlog, counted here at enqueue; /metrics shows the clients with
-- waiting runs. Only waiting (SUBMITTED) tasks are in the index: a fast-path task is inserted
-- WORKING and never enters it, so the hot path pays only the predicate.
-- Every statement here may run again on a database that already has it.
CREATE INDEX IF NOT EXISTS a2a_tasks_waiting_owner_idx ON a2a_tasks (owner) WHERE state = 'TASK_STATE_SUBMITTED';
