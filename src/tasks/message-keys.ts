import { sql, type CommonQueryMethods } from 'slonik';
import { z } from 'zod';

// The keys of the messages a client sent (sql/0028): a new task's key on its row
// (a2a_tasks.message_key, written by the task's own INSERT), a follow-up's in a2a_follow_up_keys
// (written in the transaction that hands its input to the run). Both are unique per owner, and the
// unique index decides which of two concurrent sends is the first; these reads only find what a
// repeat repeats, after its own insert was refused (or, for a follow-up, before it is tried).

/** The longest key Keel keeps (a messageId is at most 1024 characters on the wire too). */
export const MAX_MESSAGE_KEY_LENGTH = 1024;

/** What a key names: the task its message created or continued, and where that message's stream began. */
export type MessageKeyRow = { taskId: string; fingerprint: Buffer; afterSequence: number; followUp: boolean };

const keyRow = z.object({ task_id: z.string(), fingerprint: z.instanceof(Buffer), after_sequence: z.number(), follow_up: z.boolean() });

/** The message the client sent under this key, if its task still exists. */
export async function findMessageKey(db: CommonQueryMethods, owner: string, key: string): Promise<MessageKeyRow | null> {
  const row = await db.maybeOne(sql.type(keyRow)`
    SELECT id AS task_id, message_fingerprint AS fingerprint, 0 AS after_sequence, false AS follow_up
      FROM a2a_tasks WHERE owner = ${owner} AND message_key = ${key} AND message_fingerprint IS NOT NULL
    UNION ALL
    SELECT task_id, fingerprint, after_sequence, true AS follow_up
      FROM a2a_follow_up_keys WHERE owner = ${owner} AND message_key = ${key}
    LIMIT 1`);
  return row && { taskId: row.task_id, fingerprint: row.fingerprint, afterSequence: row.after_sequence, followUp: row.follow_up };
}

export type FollowUpKey = { owner: string; key: string; taskId: string; fingerprint: Buffer; afterSequence: number };

/**
 * Records a follow-up's key in the transaction that hands its input over; false when the key is
 * taken (by a new task's message or by a follow-up, committed or committing: the insert waits for
 * a concurrent one to end), and then the caller declines the hand-off.
 */
export async function insertFollowUpKey(db: CommonQueryMethods, key: FollowUpKey): Promise<boolean> {
  const inserted = await db.maybeOne(sql.type(z.object({ task_id: z.string() }))`
    INSERT INTO a2a_follow_up_keys (owner, message_key, task_id, fingerprint, after_sequence)
    SELECT ${key.owner}, ${key.key}, ${key.taskId}, ${sql.binary(key.fingerprint)}, ${key.afterSequence}
    WHERE NOT EXISTS (SELECT 1 FROM a2a_tasks WHERE owner = ${key.owner} AND message_key = ${key.key})
    ON CONFLICT (owner, message_key) DO NOTHING
    RETURNING task_id`);
  return inserted !== null;
}
