-- A push config's creation and deletion change its task's row
-- (docs/decisions/0051-push-config-changes-lock-the-task.md).
-- Every statement here may run again on a database that already has it.

-- A delivery row goes with its journal event to every config active when the event commits
-- (docs/push.md). Every journal writer locks the task row first, so a config change that also
-- writes that row is ordered against it: it commits before the writer's lock (and the writer,
-- reading the configs after its lock, sees it) or waits for the writer's commit. The held
-- completion (a fast run's end, one statement) checks the counter on the row it locked instead of
-- asking push_configs: Postgres rechecks a locked row's conditions on its newest version, never a
-- subquery, which keeps the snapshot its statement began with.
ALTER TABLE a2a_tasks ADD COLUMN IF NOT EXISTS push_config_changes int NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION keel_push_config_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE a2a_tasks SET push_config_changes = push_config_changes + 1 WHERE id = NEW.task_id;
  RETURN NULL;
END
$$;

-- Creation and deletion only: pausing, resuming and stopping are the push worker's (a paused config
-- keeps its deliveries; a stopped one is never attempted again, whatever rows name it).
CREATE OR REPLACE TRIGGER push_configs_created_change_task AFTER INSERT ON push_configs
  FOR EACH ROW EXECUTE FUNCTION keel_push_config_changed();
CREATE OR REPLACE TRIGGER push_configs_deleted_change_task AFTER UPDATE OF deleted_at ON push_configs
  FOR EACH ROW WHEN (OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL) EXECUTE FUNCTION keel_push_config_changed();
