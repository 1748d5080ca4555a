-- The task row's `revision` was never the task's own revision: it is the projector's watermark,
-- the run revision the view and the journal have reached. Its name now says so. A run revision
-- above `projected_revision` is owed to the journal (the sweeper's projection debt). No function,
-- trigger or index of earlier migrations names the column, so nothing else is replaced.
ALTER TABLE a2a_tasks RENAME COLUMN revision TO projected_revision;
