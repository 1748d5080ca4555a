-- A run's status time may be stamped by the statement that changes its status (decision 0029).
--
-- A fast run's completion is written by one statement that locks and writes at once (no read
-- before it), so its journal events, sealed by the process before the statement is sent, carry
-- a status time the process chose (its clock, never before the run started) instead of the
-- transaction's now(). The run's status_changed_at and the task's status_timestamp must be that
-- same time, or GetTask and the journal would disagree. Every other writer leaves the column
-- alone and gets now(), as before.

CREATE OR REPLACE FUNCTION keel_stamp_status_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- A writer that sets the time itself keeps it; otherwise the transaction's time.
  IF NEW.status_changed_at IS NOT DISTINCT FROM OLD.status_changed_at THEN
    NEW.status_changed_at := now();
  END IF;
  RETURN NEW;
END
$$;

-- The task's status time is its run's (now() unless the writer stamped it).
CREATE OR REPLACE FUNCTION keel_sync_task_states() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  WITH moved AS (
    UPDATE a2a_tasks t
      SET state = keel_task_state(n.status, n.failure_detail), status_timestamp = n.status_changed_at, updated_at = now()
      FROM keel_new_runs n JOIN keel_old_runs o ON o.id = n.id JOIN a2a_tasks prior ON prior.id = n.task_id
      WHERE t.id = n.task_id AND n.status IS DISTINCT FROM o.status
        AND t.state IS DISTINCT FROM keel_task_state(n.status, n.failure_detail)
      RETURNING t.owner, t.agent, prior.state AS from_state, t.state)
  INSERT INTO a2a_task_count_deltas (owner, agent, state, from_state, n)
    SELECT owner, agent, state, from_state, count(*) FROM moved GROUP BY owner, agent, state, from_state;
  RETURN NULL;
END
$$;
