-- Fewer row versions and index entries per task (docs/decisions/0024-fewer-row-versions.md).
-- Every statement here may run again on a database that already has it (a test takes the task
-- counters back out and re-applies 0009 and this file).

-- 1. Task-count deltas per statement and key, not per row. A delta row adds n to (owner, agent,
-- state) and, when from_state is set, takes n from (owner, agent, from_state): a state change is
-- one row, a move, where it was two (-1 and +1). Each statement appends one row per key it changed:
-- N tasks created for one client and agent are one row (+N), N tasks moved from one state to
-- another are one row. An echo task now appends three rows (created, claimed, completed), not five.
ALTER TABLE a2a_task_count_deltas ADD COLUMN IF NOT EXISTS from_state text;

DROP TRIGGER IF EXISTS a2a_tasks_count ON a2a_tasks;
DROP FUNCTION IF EXISTS keel_count_task_change();

CREATE OR REPLACE FUNCTION keel_count_inserted_tasks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO a2a_task_count_deltas (owner, agent, state, n)
    SELECT owner, agent, state, count(*) FROM keel_inserted_tasks GROUP BY owner, agent, state;
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION keel_count_deleted_tasks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO a2a_task_count_deltas (owner, agent, state, n)
    SELECT owner, agent, state, -count(*) FROM keel_deleted_tasks GROUP BY owner, agent, state;
  RETURN NULL;
END
$$;

-- Transition tables need one trigger per event.
CREATE OR REPLACE TRIGGER a2a_tasks_count_inserts AFTER INSERT ON a2a_tasks
  REFERENCING NEW TABLE AS keel_inserted_tasks
  FOR EACH STATEMENT EXECUTE FUNCTION keel_count_inserted_tasks();
CREATE OR REPLACE TRIGGER a2a_tasks_count_deletes AFTER DELETE ON a2a_tasks
  REFERENCING OLD TABLE AS keel_deleted_tasks
  FOR EACH STATEMENT EXECUTE FUNCTION keel_count_deleted_tasks();

-- A task's state changes only with its run's status, through keel_sync_task_states below, which
-- appends the moves of the tasks it changes itself. An UPDATE trigger with transition tables here
-- would run for every task write (the result, the journal watermark, the history: three of the
-- four per task) to find nothing; this row trigger runs only for a write of the state (or of the
-- owner or agent) that did not come from a trigger, which Keel never makes, so a hand-made change
-- (an operator's repair) still keeps the counts exact.
CREATE OR REPLACE FUNCTION keel_count_rekeyed_task() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF (OLD.owner, OLD.agent) IS NOT DISTINCT FROM (NEW.owner, NEW.agent) THEN
    INSERT INTO a2a_task_count_deltas (owner, agent, state, from_state, n) VALUES (NEW.owner, NEW.agent, NEW.state, OLD.state, 1);
  ELSE
    INSERT INTO a2a_task_count_deltas (owner, agent, state, n)
      VALUES (OLD.owner, OLD.agent, OLD.state, -1), (NEW.owner, NEW.agent, NEW.state, 1);
  END IF;
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER a2a_tasks_count_rekeys AFTER UPDATE OF owner, agent, state ON a2a_tasks
  FOR EACH ROW WHEN ((OLD.owner, OLD.agent, OLD.state) IS DISTINCT FROM (NEW.owner, NEW.agent, NEW.state) AND pg_trigger_depth() = 0)
  EXECUTE FUNCTION keel_count_rekeyed_task();

-- 2. The task's state follows its run (decision 0008) once per statement: one UPDATE moves the
-- tasks of every run whose status the statement changed, and one INSERT appends their moves, one
-- row per owner, agent, old and new state. It runs at the end of the statement, in its
-- transaction; the lock order stays run, then task (the statement has locked the runs rows it
-- changed). A task's old state is read beside the row being updated: only this trigger changes
-- it, under its run's row lock, so it cannot change in between. The status timestamp is still
-- stamped on each row as it is written.
DROP TRIGGER IF EXISTS runs_sync_task_state ON runs;
DROP FUNCTION IF EXISTS keel_sync_task_state();

CREATE OR REPLACE FUNCTION keel_stamp_status_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.status_changed_at := now();
  RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION keel_sync_task_states() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  WITH moved AS (
    UPDATE a2a_tasks t
      SET state = keel_task_state(n.status, n.failure_detail), status_timestamp = now(), updated_at = now()
      FROM keel_new_runs n JOIN keel_old_runs o ON o.id = n.id JOIN a2a_tasks prior ON prior.id = n.task_id
      WHERE t.id = n.task_id AND n.status IS DISTINCT FROM o.status
        AND t.state IS DISTINCT FROM keel_task_state(n.status, n.failure_detail)
      RETURNING t.owner, t.agent, prior.state AS from_state, t.state)
  INSERT INTO a2a_task_count_deltas (owner, agent, state, from_state, n)
    SELECT owner, agent, state, from_state, count(*) FROM moved GROUP BY owner, agent, state, from_state;
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER runs_stamp_status_change BEFORE UPDATE OF status ON runs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION keel_stamp_status_change();
CREATE OR REPLACE TRIGGER runs_sync_task_states AFTER UPDATE ON runs
  REFERENCING OLD TABLE AS keel_old_runs NEW TABLE AS keel_new_runs
  FOR EACH STATEMENT EXECUTE FUNCTION keel_sync_task_states();

-- 3. HOT updates of runs. An update is HOT (no new index entry, the new version on the same page)
-- only when no column that any index names, in its key or its predicate, changes. The partial
-- indexes on `status` (and on lease_expires_at, claimed_by, updated_at) made every run write
-- non-HOT: the claim, each lease renewal, each announced output, a suspension and a resume. One
-- index of the open runs replaces them, keyed and filtered by columns those writes leave alone;
-- the queries that looked for queued, running, handed-over and waiting runs name its predicate
-- and filter the status over open runs only (proportional to the work outstanding, as before).
-- A run leaves it when it is settled (settled_at is set with every terminal status, never before).
CREATE INDEX IF NOT EXISTS runs_open_idx ON runs (available_at, id) WHERE settled_at IS NULL;
DROP INDEX IF EXISTS runs_queued_idx;
DROP INDEX IF EXISTS runs_lease_idx;
DROP INDEX IF EXISTS runs_waiting_idx;
DROP INDEX IF EXISTS runs_handoff_idx;

-- Nothing reads tasks by creation time across owners (ListTasks pages by status time; a context's
-- tasks are read through its own index), and every task version paid an entry in it.
DROP INDEX IF EXISTS a2a_tasks_created_idx;

-- 4. Room on each page for the versions a task and its run go through (a run is written two to
-- five times, its task four to six), so an update finds space beside the old version: HOT when
-- it can be, and pruned in place instead of left for vacuum. Pages written from now on.
ALTER TABLE runs SET (fillfactor = 80);
ALTER TABLE a2a_tasks SET (fillfactor = 70);
