-- ListTasks is scoped to the agent whose endpoint is called (GetTask already answers
-- TaskNotFound for another agent's task), and pages newest status first per owner and agent.
CREATE INDEX a2a_tasks_agent_list_idx ON a2a_tasks (owner, agent, status_timestamp DESC, id DESC);
DROP INDEX a2a_tasks_owner_list_idx;

-- ListTasks' totalSize without counting rows: how many tasks each owner has per agent and state.
-- A task write must not wait on a shared counter row, so every change appends a delta
-- (a2a_task_count_deltas, written by the trigger below in the task's own transaction: insert-only,
-- no row is ever locked by two writers) and the maintenance sweep folds the deltas into
-- a2a_task_counts. A count is the folded total plus the deltas not folded yet, so it is exact at
-- every moment, and its cost depends on the writes since the last sweep, not on the table's size.
CREATE TABLE a2a_task_counts (
  owner uuid NOT NULL,
  agent text NOT NULL,
  state text NOT NULL,
  n bigint NOT NULL,
  PRIMARY KEY (owner, agent, state)
);

CREATE TABLE a2a_task_count_deltas (
  owner uuid NOT NULL,
  agent text NOT NULL,
  state text NOT NULL,
  n integer NOT NULL
);
CREATE INDEX a2a_task_count_deltas_idx ON a2a_task_count_deltas (owner, agent, state);

CREATE FUNCTION keel_count_task_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO a2a_task_count_deltas (owner, agent, state, n) VALUES (NEW.owner, NEW.agent, NEW.state, 1);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO a2a_task_count_deltas (owner, agent, state, n) VALUES (OLD.owner, OLD.agent, OLD.state, -1);
  ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
    INSERT INTO a2a_task_count_deltas (owner, agent, state, n)
      VALUES (OLD.owner, OLD.agent, OLD.state, -1), (NEW.owner, NEW.agent, NEW.state, 1);
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER a2a_tasks_count AFTER INSERT OR DELETE OR UPDATE OF state ON a2a_tasks
  FOR EACH ROW EXECUTE FUNCTION keel_count_task_change();

-- The tasks that exist already.
INSERT INTO a2a_task_counts (owner, agent, state, n)
  SELECT owner, agent, state, count(*) FROM a2a_tasks GROUP BY owner, agent, state;
