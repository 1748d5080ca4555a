import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Page } from 'playwright-core';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Task } from '@a2a-js/sdk';
import { createClient } from '../../src/auth/client-repository.js';
import { createAdminToken } from '../../src/ui/admin-auth.js';
import { runVersion } from '../../src/ui/ui-queries.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { launchHeadlessChromium, type HeadlessChromium } from '../support/headless-chromium.js';
import { insertMachineRun } from '../support/statechart-rows.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitForRunStatus } from '../support/wait-for.js';
import { failNext, recoveryCounters } from '../fixtures/statecharts/recovery-steps.js';

// Operator recovery in a real browser (Debian's Chromium through playwright-core, as
// test/e2e/statechart-agents.browser.test.ts): the run lifecycle draws the operator's guarded
// RETRY; a failed statechart run's page retries it from a state it passed through, and the run
// works on to completion without its non-idempotent charge running again; a retry that would run
// it again is refused on the page; the runs page previews a bulk cancel and a bulk retry (a dry
// run: no row changes) and confirms them. A run page reloads itself when the run changes, but not
// once the operator changed a field on it or sent a form. Screenshots go to test/e2e/screenshots/.

type DomNode = { getAttribute(name: string): string | null; textContent: string | null };
type DomList = Iterable<DomNode> & { forEach(callback: (node: DomNode) => void): void };
declare const document: { querySelectorAll(selector: string): DomList };

const SCREENSHOTS = fileURLToPath(new URL('./screenshots/', import.meta.url));
const MACHINE = fileURLToPath(new URL('../fixtures/statecharts/recovery.machine.ts', import.meta.url));

let keel: TestKeel;
let page: Page;
let browser: HeadlessChromium | undefined;
let adminToken = '';
let clientToken = '';

const shot = async (name: string) => {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${process.env.KEEL_TEST_QUEUE ?? 'postgres'}-recovery-${name}.png`), fullPage: true });
};

beforeAll(async () => {
  keel = await startTestKeel({ overrides: { KEEL_AGENTS: [{ id: 'recovery', name: 'Recovery', machine: MACHINE }] } });
  adminToken = (await createAdminToken(keel.context.pool, 'browser')).token;
  const client = await createClient(keel.context.pool, 'recovery-browser');
  if (!client.ok) throw new Error('client');
  clientToken = client.token;
  browser = await launchHeadlessChromium();
  ({ page } = browser);
  await page.goto(`${keel.url}/ui/login`);
  await page.fill('input[name="token"]', adminToken);
  await Promise.all([page.waitForURL(`${keel.url}/ui/machines`), page.click('button[type="submit"]')]);
}, 120_000);

/**
 * The run's page, once what it shows has settled. A run page reloads itself when the run changes
 * (the live reload of src/ui/layout.ts: its version, runVersion, counts the task's projection, the
 * run's events and deliveries), and a goto while such a reload is under way is interrupted by it
 * ("navigation interrupted by another navigation"). Right after a run failed or a retry ended, its
 * projection and audit rows may still be landing: on a loaded CI machine three gotos in a row were
 * interrupted that way. So the page is gone to once the version has stayed the same for a moment,
 * and gone to again if a reload still interrupts it.
 */
async function gotoRunPage(id: string): Promise<void> {
  const deadline = Date.now() + 15_000;
  let last = await runVersion(keel.context.pool, id);
  let unchangedSince = Date.now();
  while (Date.now() - unchangedSince < 500 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    const now = await runVersion(keel.context.pool, id);
    if (now !== last) {
      last = now;
      unchangedSince = Date.now();
    }
  }
  for (let attempt = 1; ; attempt += 1) {
    try {
      await page.goto(`${keel.url}/ui/runs/${id}`);
      return;
    } catch (error) {
      if (attempt >= 5 || !String(error).includes('interrupted by another navigation')) throw error;
    }
  }
}

afterAll(async () => {
  await browser?.close();
  await keel?.dispose();
});

/** A run of the recovery agent for `text`, failed in `step` (which throws once). */
async function failedRun(text: string, step: 'charge' | 'notify'): Promise<string> {
  failNext(text, step, 1);
  const client = await sdkClient(keel.url, 'recovery', clientToken);
  const task = Task.toJSON((await client.sendMessage(textMessage(text))) as Task) as { id: string; status: { state: string } };
  expect(task.status.state).toBe('TASK_STATE_FAILED');
  return task.id;
}

const rows = () =>
  keel.context.pool.any(sql.type(z.object({ id: z.string(), status: z.string(), revision: z.number() }))`SELECT id, status, revision FROM runs ORDER BY id`);
const outcomes = () =>
  page.evaluate(() => {
    const result: Record<string, string> = {};
    document.querySelectorAll('#bulk-items tbody tr').forEach((node) => (result[node.getAttribute('data-run')!] = node.getAttribute('data-outcome')!));
    return result;
  });

describe('operator recovery in the UI', () => {
  it('the run lifecycle draws the guarded RETRY from failed back to queued', async () => {
    const labels = await page.evaluate(() => {
      const result: string[] = [];
      document.querySelectorAll('svg.statechart[data-machine="run"] g.edge-label text').forEach((node) => result.push(node.textContent ?? ''));
      return result;
    });
    expect(labels).toContain('RETRY [guarded]');
  });

  it('a failed run\'s page retries it from a state it passed through; the run completes and its charge ran once', async () => {
    const id = await failedRun('page', 'notify');
    await gotoRunPage(id);
    const options = await page.locator('#retry-state option').allTextContents();
    expect(options).toEqual(['notifying (last)', 'recording', 'charging', 'looking_up']);
    await shot('retry-form');
    await page.selectOption('#retry-state', 'recording');
    // The retry answers with the run's page (its flash goes with the page's next live reload).
    const [answer] = await Promise.all([page.waitForResponse((response) => response.url().endsWith(`/ui/runs/${id}/retry`)), page.click('#retry-button')]);
    expect(answer.status()).toBe(303);
    expect(answer.headers().location).toBe(`/ui/runs/${id}?flash=retried`);
    await waitForRunStatus(keel.context.pool, id, ['completed']);
    expect(recoveryCounters('page')).toEqual({ lookups: 1, charges: 1, records: 2, notices: 2 });
    await gotoRunPage(id);
    expect((await page.textContent('#run-status'))!.trim()).toBe('completed');
    expect((await page.textContent('#task-state'))!.trim()).toBe('TASK_STATE_COMPLETED');
    expect(await page.locator('#retry-run').count()).toBe(0);
    // The timeline shows the time it lay failed until the retry; the events name the operator.
    expect(await page.locator('#run-timeline g.segment[data-kind="retry"]').first().textContent()).toContain('retried by browser from state recording');
    expect(await page.locator('#timeline').textContent()).toContain('operator_retried');
    await page.locator('#run-timeline').scrollIntoViewIfNeeded();
    await shot('retried');
  });

  it('a run page the operator is filling in is not reloaded under them when the run changes: the choice stays, the stamp says it changed, the retry goes through', async () => {
    const id = await failedRun('page-held', 'notify');
    await gotoRunPage(id);
    await page.evaluate(() => Object.assign(globalThis, { loadedOnce: true }));
    await page.selectOption('#retry-state', 'recording');
    // The run changes under the page (one more audit row: its live version moves).
    await keel.context.pool.query(sql.unsafe`
      INSERT INTO run_events (run_id, sequence, kind) SELECT ${id}, max(sequence) + 1, 'test_marker' FROM run_events WHERE run_id = ${id}`);
    const stamp = () =>
      page.evaluate(() => {
        let text = '';
        document.querySelectorAll('#live-stamp').forEach((node) => (text = node.textContent ?? ''));
        return text;
      });
    await expect.poll(stamp, { timeout: 15_000 }).toContain('changed since loaded');
    expect(await page.evaluate(() => (globalThis as { loadedOnce?: boolean }).loadedOnce)).toBe(true);
    expect(await page.locator('#retry-state').inputValue()).toBe('recording');
    // The retry the operator chose still goes through.
    const [answer] = await Promise.all([page.waitForResponse((response) => response.url().endsWith(`/ui/runs/${id}/retry`)), page.click('#retry-button')]);
    expect(answer.status()).toBe(303);
    await waitForRunStatus(keel.context.pool, id, ['completed']);
    expect(recoveryCounters('page-held')).toEqual({ lookups: 1, charges: 1, records: 2, notices: 2 });
    // A page nobody worked in reloads as before.
    await gotoRunPage(id);
    await page.evaluate(() => Object.assign(globalThis, { loadedOnce: true }));
    await keel.context.pool.query(sql.unsafe`
      INSERT INTO run_events (run_id, sequence, kind) SELECT ${id}, max(sequence) + 1, 'test_marker' FROM run_events WHERE run_id = ${id}`);
    await page.waitForFunction(() => (globalThis as { loadedOnce?: boolean }).loadedOnce === undefined, undefined, { timeout: 15_000 });
  });

  it('a retry that would run the non-idempotent charge again is refused on the page', async () => {
    const id = await failedRun('page-inside', 'charge');
    await gotoRunPage(id);
    await page.click('#retry-button');
    await page.waitForSelector('#retry-refused');
    expect(await page.textContent('#retry-refused')).toContain('would run again step charge (charge), a non-idempotent write it already started');
    expect((await rows()).find((row) => row.id === id)?.status).toBe('failed');
    expect(recoveryCounters('page-inside').charges).toBe(1);
  });

  it('bulk cancel: a preview lists the runs and changes nothing; the confirmation cancels exactly those', async () => {
    const pool = keel.context.pool;
    const chosen = [
      await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_input', hash: 'h', state: 'recording' }),
      await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_input', hash: 'h', state: 'recording' }),
    ];
    const other = await insertMachineRun(pool, { agent: 'recovery', status: 'waiting_for_input', hash: 'h', state: 'charging' });
    // Filtered by agent, the runs page opens its recovery form with the agent chosen.
    await page.goto(`${keel.url}/ui/runs?agent=recovery`);
    expect(await page.locator('#bulk-recovery select[name="agent"]').inputValue()).toBe('recovery');
    await page.selectOption('#bulk-recovery select[name="status"]', 'waiting_for_input');
    await page.fill('#bulk-recovery input[name="state"]', 'recording');
    const before = await rows();
    await Promise.all([page.waitForURL('**/ui/runs/recover?**'), page.click('#preview-cancel')]);
    expect(await outcomes()).toEqual(Object.fromEntries(chosen.map((id) => [id, 'would_cancel'])));
    expect(await page.getAttribute('#bulk-summary', 'data-would')).toBe('2');
    expect(await rows()).toEqual(before);
    await shot('bulk-cancel-preview');
    await Promise.all([page.waitForURL('**/ui/runs/recover'), page.click('#bulk-confirm-button')]);
    expect(await page.getAttribute('#bulk-summary', 'data-changed')).toBe('2');
    const after = await rows();
    for (const id of chosen) expect(after.find((row) => row.id === id)?.status).toBe('cancelled');
    expect(after.find((row) => row.id === other)?.status).toBe('waiting_for_input');
  });

  it('bulk retry: the preview says where each run would start or why it is refused; the confirmation retries them', async () => {
    const a = await failedRun('ui-bulk-a', 'notify');
    const b = await failedRun('ui-bulk-b', 'notify');
    await page.goto(`${keel.url}/ui/runs?agent=recovery&status=failed&reason=not_retryable`);
    const before = await rows();
    await Promise.all([page.waitForURL('**/ui/runs/recover?**'), page.click('#preview-retry')]);
    const previewed = await outcomes();
    expect(previewed[a]).toBe('would_retry');
    expect(previewed[b]).toBe('would_retry');
    // The run whose charge failed is refused, with the reason on its row.
    expect(Object.values(previewed)).toContain('refused');
    expect(await page.locator('#bulk-items tr[data-outcome="refused"]').first().textContent()).toContain('non-idempotent write');
    expect(await page.locator(`#bulk-items tr[data-run="${a}"]`).textContent()).toContain('from state notifying');
    expect(await rows()).toEqual(before);
    await shot('bulk-retry-preview');
    await Promise.all([page.waitForURL('**/ui/runs/recover'), page.click('#bulk-confirm-button')]);
    expect(await page.getAttribute('#bulk-summary', 'data-changed')).toBe('2');
    for (const id of [a, b]) expect((await waitForRunStatus(keel.context.pool, id, ['completed', 'failed'])).status).toBe('completed');
    expect(recoveryCounters('ui-bulk-a')).toEqual({ lookups: 1, charges: 1, records: 1, notices: 2 });
    expect(recoveryCounters('page-inside').charges).toBe(1);
  });
});
