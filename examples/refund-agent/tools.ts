import { randomUUID } from 'node:crypto';
import { appendFile, mkdir, readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
// Keel's tool shape (src/tools/tool.ts): a tool module only has to export objects that match it.
import type { ToolDefinition } from '../../src/tools/tool.js';

// The refund agent's tool, loaded through `toolModules` (keel.config.yaml). `issue_refund` is an
// idempotent write: Keel may run it again when a worker died while it was in flight, so it is keyed
// by the call's id, which for a statechart's callTool step is the step's durable key (the same on
// the re-run). A real tool would send that key to the payment provider as its Idempotency-Key; this
// one keeps its own ledger, a JSON-lines file that outlives the process as the provider would
// (REFUND_LEDGER, default .keel/refund-ledger.jsonl under the directory Keel runs in).

type LedgerEntry = { idempotencyKey: string; refundId: string; amount: number; reason: string; issuedAt: string };

export const ledgerPath = (): string => resolve(process.env.REFUND_LEDGER ?? '.keel/refund-ledger.jsonl');

/** The refunds issued so far, in the order they were issued. */
export async function readLedger(path = ledgerPath()): Promise<LedgerEntry[]> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw error;
  }
  return text
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as LedgerEntry);
}

export const issueRefund: ToolDefinition = {
  name: 'issue_refund',
  description: 'Pays back an amount to the customer (once per idempotency key)',
  parameters: {
    type: 'object',
    properties: { amount: { type: 'number', exclusiveMinimum: 0 }, reason: { type: 'string' } },
    required: ['amount', 'reason'],
  },
  effect: 'idempotent_write',
  // The machine asks for approval itself, above its limit.
  needsApproval: false,
  run: async (args, context) => {
    const amount = args.amount;
    if (typeof amount !== 'number' || !Number.isFinite(amount) || amount <= 0) return { kind: 'error', message: 'amount must be a positive number' };
    if (typeof args.reason !== 'string' || args.reason.trim() === '') return { kind: 'error', message: 'reason must be a non-empty string' };
    const path = ledgerPath();
    const idempotencyKey = `${context.runId}:${context.toolCallId}`;
    // The same key again (a re-run after a crash) gets the refund already issued, not a second one.
    const issued = (await readLedger(path)).find((entry) => entry.idempotencyKey === idempotencyKey);
    if (issued) return { kind: 'ok', content: { refundId: issued.refundId, amount: issued.amount, reason: issued.reason, issuedAt: issued.issuedAt } };
    const entry: LedgerEntry = { idempotencyKey, refundId: `rf_${randomUUID().slice(0, 8)}`, amount, reason: args.reason.trim(), issuedAt: new Date().toISOString() };
    await mkdir(dirname(path), { recursive: true });
    // One line per refund, appended: concurrent refunds of other runs do not overwrite each other.
    await appendFile(path, `${JSON.stringify(entry)}\n`, { mode: 0o600 });
    context.logger.info({ refundId: entry.refundId, runId: context.runId }, 'refund issued');
    return { kind: 'ok', content: { refundId: entry.refundId, amount: entry.amount, reason: entry.reason, issuedAt: entry.issuedAt } };
  },
};

export const tools: ToolDefinition[] = [issueRefund];
