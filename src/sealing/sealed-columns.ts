// Every sealed column in Keel's schema. Start-up asks whether any sealed value exists, and key
// rotation rewraps each listed column; a migration that adds a sealed column adds it here.
export type SealedColumn = { table: string; column: string; idColumn: string };

export const SEALED_COLUMNS: readonly SealedColumn[] = [
  { table: 'runs', column: 'queued_request', idColumn: 'id' },
  { table: 'runs', column: 'suspended_state', idColumn: 'id' },
];
