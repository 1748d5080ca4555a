// Every sealed column in Keel's schema. Start-up asks whether any sealed value exists, and key
// rotation rewraps each listed column; a migration that adds a sealed column adds it here.
// The seal context's rowId is the key columns' text values joined with '/'.
export type SealedColumn = { table: string; column: string; keyColumns: readonly string[] };

export const SEALED_COLUMNS: readonly SealedColumn[] = [
  { table: 'runs', column: 'queued_request', keyColumns: ['id'] },
  { table: 'runs', column: 'suspended_state', keyColumns: ['id'] },
  { table: 'run_outputs', column: 'content', keyColumns: ['run_id', 'ordinal'] },
];
