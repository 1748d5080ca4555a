-- One trigger function deletes a deleted task's journal and a deleted run's audit rows
-- (docs/decisions/0049-log-rows-without-foreign-key-checks.md).
-- Every statement here may run again on a database that already has it.

-- sql/0022 gave each log a function of its own with the same body. One function does both: each
-- trigger names the log table and the column that holds the deleted parent's id. Dynamic SQL,
-- planned on each call from the rows at hand (a deletion is retention's work, not the hot path's),
-- so no plan kept for the session can turn into a scan of the whole log.
CREATE OR REPLACE FUNCTION keel_delete_log_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('DELETE FROM %I l USING keel_deleted_parents p WHERE l.%I = p.id', TG_ARGV[0], TG_ARGV[1]);
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER a2a_tasks_delete_journal AFTER DELETE ON a2a_tasks
  REFERENCING OLD TABLE AS keel_deleted_parents
  FOR EACH STATEMENT EXECUTE FUNCTION keel_delete_log_rows('a2a_events', 'task_id');
CREATE OR REPLACE TRIGGER runs_delete_audit AFTER DELETE ON runs
  REFERENCING OLD TABLE AS keel_deleted_parents
  FOR EACH STATEMENT EXECUTE FUNCTION keel_delete_log_rows('run_events', 'run_id');

DROP FUNCTION IF EXISTS keel_delete_task_journal();
DROP FUNCTION IF EXISTS keel_delete_run_audit();
