import { DEFAULT_SCHEMA, runMigrations, type PgPoolClient } from 'bullmq';

/**
 * BullMQ's own schema (`bullmq`), migrated once per process before any of its pools is used.
 * BullMQ migrates only the pools it builds itself; Keel hands it pools of its own (`QueuePool`).
 */
export class BullmqSchema {
  private migrated: Promise<void> | undefined;

  /** Migrates on the first call; a failed attempt (Postgres down) is tried again on the next. */
  ensure(connect: () => Promise<PgPoolClient>): Promise<void> {
    if (!this.migrated) {
      const attempt = migrateOn(connect);
      this.migrated = attempt;
      attempt.catch(() => {
        if (this.migrated === attempt) this.migrated = undefined;
      });
    }
    return this.migrated;
  }
}

async function migrateOn(connect: () => Promise<PgPoolClient>): Promise<void> {
  const client = await connect();
  let broken = false;
  try {
    await runMigrations(client, DEFAULT_SCHEMA);
  } catch (error) {
    broken = true;
    throw error;
  } finally {
    client.release(broken);
  }
}
