-- The runs trigger moves tasks by primary-key lookups whatever the tables' sizes when it was
-- first planned (decision 0038).
--
-- PL/pgSQL plans a statement without parameters at its first run in a session and keeps that plan
-- for the session. keel_sync_task_states (sql/0016, 0018) joined the statement's transition tables
-- to a2a_tasks: a session whose first update of runs came while a2a_tasks was small (a new
-- installation, a bench's warm-up), or carried many runs, planned a hash join over a sequential
-- scan of a2a_tasks and kept it, so every later update of runs in that session, a lease renewal
-- included, read every task. With autovacuum off nothing ever invalidated the plan.
--
-- Now the statement is driven by the old rows alone: each updated run is looked up in runs (an
-- AFTER trigger sees the statement's own writes, so runs holds exactly the new rows, and the rows
-- stay locked by the statement until its transaction ends), then its task, both by primary key.
-- The function's planner settings leave only that plan: nested loops over index lookups, linear in
-- the rows the statement changed and independent of the tables' sizes, for one run or a thousand.
CREATE OR REPLACE FUNCTION keel_sync_task_states() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
BEGIN
  WITH moved AS (
    UPDATE a2a_tasks t
      SET state = keel_task_state(n.status, n.failure_detail), status_timestamp = n.status_changed_at, updated_at = now()
      FROM keel_old_runs o JOIN runs n ON n.id = o.id JOIN a2a_tasks prior ON prior.id = n.task_id
      WHERE t.id = n.task_id AND n.status IS DISTINCT FROM o.status
        AND t.state IS DISTINCT FROM keel_task_state(n.status, n.failure_detail)
      RETURNING t.owner, t.agent, prior.state AS from_state, t.state)
  INSERT INTO a2a_task_count_deltas (owner, agent, state, from_state, n)
    SELECT owner, agent, state, from_state, count(*) FROM moved GROUP BY owner, agent, state, from_state;
  RETURN NULL;
END
$$;

-- The trigger no longer reads the new rows from a transition table.
CREATE OR REPLACE TRIGGER runs_sync_task_states AFTER UPDATE ON runs
  REFERENCING OLD TABLE AS keel_old_runs
  FOR EACH STATEMENT EXECUTE FUNCTION keel_sync_task_states();
