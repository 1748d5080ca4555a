-- The journal and the audit trail without a foreign key check per row
-- (docs/decisions/0049-log-rows-without-foreign-key-checks.md).
-- Every statement here may run again on a database that already has it.

-- A foreign key checks each inserted row with a query of its own that also locks the parent row
-- (SELECT ... FOR KEY SHARE): a task on the fast path inserts three journal rows and two audit
-- rows, five such checks of its eight, a tenth of the execution time of the statement that
-- writes a batch of creations and completions. Every writer of these two
-- append-only logs writes for a task or run it holds (in the statement or transaction that
-- inserts, updates or locks it, or under the run's lease), and only retention deletes them, long
-- settled, so the checks never refused a row. What the keys also did, delete a task's journal and
-- a run's audit trail with it, is done by the two triggers below, once per deleting statement,
-- with the rows it deleted.
ALTER TABLE a2a_events DROP CONSTRAINT IF EXISTS a2a_events_task_id_fkey;
ALTER TABLE run_events DROP CONSTRAINT IF EXISTS run_events_run_id_fkey;

-- Dynamic SQL: planned on each call from the rows at hand (a deletion is retention's work, not
-- the hot path's), so no plan kept for the session can turn into a scan of the whole log.
CREATE OR REPLACE FUNCTION keel_delete_task_journal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE 'DELETE FROM a2a_events e USING keel_gone_tasks g WHERE e.task_id = g.id';
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION keel_delete_run_audit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE 'DELETE FROM run_events e USING keel_gone_runs g WHERE e.run_id = g.id';
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER a2a_tasks_delete_journal AFTER DELETE ON a2a_tasks
  REFERENCING OLD TABLE AS keel_gone_tasks
  FOR EACH STATEMENT EXECUTE FUNCTION keel_delete_task_journal();
CREATE OR REPLACE TRIGGER runs_delete_audit AFTER DELETE ON runs
  REFERENCING OLD TABLE AS keel_gone_runs
  FOR EACH STATEMENT EXECUTE FUNCTION keel_delete_run_audit();
