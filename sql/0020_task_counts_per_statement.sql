-- Task-count moves appended once per statement, for every writer (docs/decisions/0042-task-counts-per-statement.md).
-- Every statement here may run again on a database that already has it.

-- 1. One statement trigger counts every UPDATE of a2a_tasks. Since the completions write the
-- task's state themselves (decision 0036), the row trigger a2a_tasks_count_rekeys ran once per
-- completed task and appended one delta row each: a batch of ten completions was ten PL/pgSQL
-- calls and ten inserts. This trigger runs once per statement, whoever writes: the completions,
-- the runs trigger below, an operator's hand-made repair. From its transition tables it appends
-- one move per (owner, agent, old state, new state) for the rows that kept their id, owner and
-- agent, and for any other row (an id, owner or agent written by hand) its -1 and +1 per key.
-- It reads only the two transition tables, never a2a_tasks, so no plan it keeps for the session
-- can grow with the table (decision 0038). An update that moves no state appends nothing.
CREATE OR REPLACE FUNCTION keel_count_updated_tasks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO a2a_task_count_deltas (owner, agent, state, from_state, n)
    SELECT n.owner, n.agent, n.state, o.state, count(*)
      FROM keel_old_tasks o JOIN keel_new_tasks n ON n.id = o.id AND n.owner = o.owner AND n.agent = o.agent
      WHERE n.state <> o.state
      GROUP BY n.owner, n.agent, n.state, o.state
    UNION ALL
    SELECT owner, agent, state, NULL, sum(d)
      FROM (
        SELECT o.owner, o.agent, o.state, -1 AS d FROM keel_old_tasks o
          WHERE NOT EXISTS (SELECT 1 FROM keel_new_tasks n WHERE n.id = o.id AND n.owner = o.owner AND n.agent = o.agent)
        UNION ALL
        SELECT n.owner, n.agent, n.state, 1 FROM keel_new_tasks n
          WHERE NOT EXISTS (SELECT 1 FROM keel_old_tasks o WHERE o.id = n.id AND o.owner = n.owner AND o.agent = n.agent)
      ) rekeyed
      GROUP BY owner, agent, state
      HAVING sum(d) <> 0;
  RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS a2a_tasks_count_rekeys ON a2a_tasks;
DROP FUNCTION IF EXISTS keel_count_rekeyed_task();
CREATE OR REPLACE TRIGGER a2a_tasks_count_updates AFTER UPDATE ON a2a_tasks
  REFERENCING OLD TABLE AS keel_old_tasks NEW TABLE AS keel_new_tasks
  FOR EACH STATEMENT EXECUTE FUNCTION keel_count_updated_tasks();

-- 2. The runs trigger only moves the tasks; the update it makes is counted by the trigger above,
-- one move per key as before. Otherwise as sql/0019: driven by the old rows, primary-key lookups.
CREATE OR REPLACE FUNCTION keel_sync_task_states() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
BEGIN
  UPDATE a2a_tasks t
    SET state = keel_task_state(n.status, n.failure_detail), status_timestamp = n.status_changed_at, updated_at = now()
    FROM keel_old_runs o JOIN runs n ON n.id = o.id
    WHERE t.id = n.task_id AND n.status IS DISTINCT FROM o.status
      AND t.state IS DISTINCT FROM keel_task_state(n.status, n.failure_detail);
  RETURN NULL;
END
$$;

-- 3. A writer that stamps the status time itself (a held completion, decision 0029) no longer
-- calls the stamping function at all: the trigger's condition is the function's own test, which
-- Postgres evaluates without entering PL/pgSQL.
CREATE OR REPLACE TRIGGER runs_stamp_status_change BEFORE UPDATE OF status ON runs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status_changed_at IS NOT DISTINCT FROM OLD.status_changed_at)
  EXECUTE FUNCTION keel_stamp_status_change();

-- 4. A task's owner is already held to a client through its context: (owner, context_id) must name
-- a context (both NOT NULL), and a context's owner must name a client, which cannot be deleted while
-- it has contexts. The direct reference checked the same client row once more per task created.
ALTER TABLE a2a_tasks DROP CONSTRAINT IF EXISTS a2a_tasks_owner_fkey;
