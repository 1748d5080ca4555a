// Every sealed column in Keel's schema. Start-up asks whether any sealed value exists, and key
// rotation rewraps each listed column; a migration that adds a sealed column adds it here.
// The seal context's rowId is the key columns' text values joined with '/'.
export type SealedColumn = { table: string; column: string; keyColumns: readonly string[] };

export const SEALED_COLUMNS: readonly SealedColumn[] = [
  { table: 'runs', column: 'queued_request', keyColumns: ['id'] },
  { table: 'runs', column: 'suspended_state', keyColumns: ['id'] },
  { table: 'run_outputs', column: 'content', keyColumns: ['run_id', 'ordinal'] },
  { table: 'a2a_tasks', column: 'status_message', keyColumns: ['id'] },
  { table: 'a2a_tasks', column: 'artifacts', keyColumns: ['id'] },
  { table: 'a2a_tasks', column: 'history', keyColumns: ['id'] },
  { table: 'a2a_events', column: 'payload', keyColumns: ['task_id', 'sequence'] },
  { table: 'push_configs', column: 'token', keyColumns: ['task_id', 'id'] },
  { table: 'push_configs', column: 'credentials', keyColumns: ['task_id', 'id'] },
  { table: 'dependencies', column: 'result', keyColumns: ['id'] },
  { table: 'inbox_callbacks', column: 'body', keyColumns: ['id'] },
];
