import { copyFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { BrowserContext, Page } from 'playwright-core';
import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { getRun } from '../../src/runs/run-repository.js';
import { createAdminToken } from '../../src/ui/admin-auth.js';
import { loadMachineCatalog, type CatalogEntry } from '../../src/ui/machine-catalog.js';
import { databaseCounts, LOOPBACK_PUSH_OVERRIDES, sendWithPush, startHookReceiver, type HookReceiver } from '../support/operator-ui.js';
import { runToEnd, startRun, TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor, waitForRunStatus } from '../support/wait-for.js';
import { launchHeadlessChromium, type HeadlessChromium } from '../support/headless-chromium.js';

// The operator UI in a real browser: Debian's Chromium driven by playwright-core (which downloads
// nothing). Log in; the machines page shows every state of every machine with the database's
// counts, and they change without a reload when a run completes; approve a waiting run from the
// inbox and see it complete; resume a paused push config and see its deliveries arrive. Each page
// is saved under test/e2e/screenshots/ for review (KEEL_DOCS_SCREENSHOTS=1 also refreshes the
// README's pictures in docs/images/).

// The callbacks given to page.evaluate and waitForFunction run in the browser; the DOM is typed
// here only as far as they use it (the project compiles without the DOM library).
type DomNode = { getAttribute(name: string): string | null; textContent: string | null };
type DomList = Iterable<DomNode> & { forEach(callback: (node: DomNode) => void): void };
declare const document: {
  querySelectorAll(selector: string): DomList;
  querySelector(selector: string): DomNode | null;
  getElementById(id: string): DomNode | null;
  body: DomNode;
};
declare const window: Record<string, unknown>;

const SCREENSHOTS = fileURLToPath(new URL('./screenshots/', import.meta.url));
const DOCS_IMAGES = fileURLToPath(new URL('../../docs/images/', import.meta.url));
const CREDENTIAL = 'browser-test-credential-Xy93-do-not-show';

let keel: TestKeel;
let receiver: HookReceiver;
let context: BrowserContext;
let page: Page;
let browser: HeadlessChromium | undefined;
let adminToken = '';
let clientToken = '';
let catalog: CatalogEntry[];

const shot = async (name: string) => {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${process.env.KEEL_TEST_QUEUE ?? 'postgres'}-${name}.png`), fullPage: true });
};

beforeAll(async () => {
  receiver = await startHookReceiver([401, 200]);
  keel = await startTestKeel({
    overrides: {
      ...LOOPBACK_PUSH_OVERRIDES,
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com' } }] }, { reply: 'mail handled' }] },
        broken: { type: 'scripted', steps: [{ fail: 'client_error' }] },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'mailer', name: 'Mailer', provider: 'mailer', tools: ['send_email'] },
        { id: 'broken', name: 'Broken', provider: 'broken' },
      ],
    },
  });
  adminToken = (await createAdminToken(keel.context.pool, 'browser')).token;
  const client = await createClient(keel.context.pool, 'browser-client');
  if (!client.ok) throw new Error('client');
  clientToken = client.token;
  catalog = await loadMachineCatalog();
  // Rows in several states before the first look.
  await sendWithPush(keel, clientToken, 'echo', 'a task over A2A', null, false);
  await runToEnd(keel, 'echo', 'a run inside Keel');
  await runToEnd(keel, 'broken', 'this one fails');
  await waitForRunStatus(keel.context.pool, await startRun(keel, 'mailer', 'waits for an operator'), ['waiting_for_approval']);

  browser = await launchHeadlessChromium();
  ({ context, page } = browser);
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await keel?.dispose();
  await receiver?.close();
});

/** What the machines page shows: machine → state → count, read from the drawn statecharts. */
const shownCounts = () =>
  page.evaluate(() => {
    const result: Record<string, Record<string, number | null>> = {};
    document.querySelectorAll('svg.statechart g.state').forEach((node) => {
      const machine = node.getAttribute('data-machine')!;
      const value = node.getAttribute('data-count');
      (result[machine] ??= {})[node.getAttribute('data-state')!] = value === null || value === '' ? null : Number(value);
    });
    return result;
  });

describe('operator UI in Chromium', () => {
  it('logs in with an admin token', async () => {
    await page.goto(`${keel.url}/ui/machines`);
    expect(new URL(page.url()).pathname).toBe('/ui/login');
    await shot('login');
    await page.fill('input[name="token"]', 'keel_admin_not-a-real-token');
    await page.click('button[type="submit"]');
    await expect.poll(() => page.textContent('.flash.error')).toContain('not a valid admin token');
    await page.fill('input[name="token"]', adminToken);
    await Promise.all([page.waitForURL(`${keel.url}/ui/machines`), page.click('button[type="submit"]')]);
    expect(await page.textContent('h1')).toBe('Machines');
    const cookies = await context.cookies(keel.url + '/ui');
    const session = cookies.find((cookie) => cookie.name === 'keel_ui_session')!;
    expect(session).toMatchObject({ httpOnly: true, sameSite: 'Strict', path: '/ui' });
  });

  it('shows every state of every machine with the counts of the database', async () => {
    await page.goto(`${keel.url}/ui/machines`);
    const shown = await shownCounts();
    // Every machine and every state is drawn, none more.
    expect(Object.keys(shown).sort()).toEqual(catalog.map((entry) => entry.id).sort());
    for (const entry of catalog) expect(Object.keys(shown[entry.id]!).sort(), entry.id).toEqual(entry.model.states.map((state) => state.name).sort());
    expect(Object.keys(shown)).toEqual(expect.arrayContaining(['run', 'task', 'delivery', 'pushConfig', 'dependency']));
    // Equal to the test's own count of the rows (nothing is in flight now: only settled and waiting rows).
    const counted = await databaseCounts(keel.context.pool, catalog);
    expect(counted.run!.completed).toBeGreaterThanOrEqual(2);
    expect(counted.run!.failed).toBe(1);
    expect(counted.run!.waiting_for_approval).toBe(1);
    expect(counted.task!.TASK_STATE_COMPLETED).toBe(1);
    // The page's script keeps polling; what it shows is the database's numbers.
    await expect.poll(() => shownCounts(), { timeout: 10_000 }).toEqual(counted);
    await shot('machines');
  });

  it('lists the rows of a state when the state is clicked', async () => {
    await page.goto(`${keel.url}/ui/machines`);
    await Promise.all([page.waitForURL('**/ui/machines/run/completed'), page.click('svg.statechart g.state[data-machine="run"][data-state="completed"]')]);
    const counted = await databaseCounts(keel.context.pool, catalog);
    expect(Number(await page.textContent('[data-state-total]'))).toBe(counted.run!.completed);
    expect(await page.locator('table tbody tr').count()).toBe(counted.run!.completed);
    await shot('machine-state-rows');
    await page.goto(`${keel.url}/ui/machines`);
    await Promise.all([page.waitForURL('**/ui/machines/run/waiting_for_approval'), page.click('svg.statechart g.state[data-machine="run"][data-state="waiting_for_approval"]')]);
    expect(await page.locator('table tbody tr').count()).toBe(1);
  });

  it('updates the counts without a reload when a run completes', async () => {
    await page.goto(`${keel.url}/ui/machines`);
    await page.evaluate(() => (window.notReloaded = true));
    const before = (await shownCounts()).run!.completed!;
    await runToEnd(keel, 'echo', 'counted live');
    await page.waitForFunction(
      (expected) => document.querySelector('svg.statechart g.state[data-machine="run"][data-state="completed"]')?.getAttribute('data-count') === String(expected),
      before + 1,
    );
    expect(await page.evaluate(() => window.notReloaded)).toBe(true);
    expect(await page.textContent('svg.statechart g.state[data-machine="run"][data-state="completed"] .count')).toBe(String(before + 1));
    const counted = await databaseCounts(keel.context.pool, catalog);
    await expect.poll(async () => (await shownCounts()).run, { timeout: 10_000 }).toEqual(counted.run);
  });

  it('approves a waiting run from the inbox and shows it complete', async () => {
    const runId = await startRun(keel, 'mailer', 'tell ops from the browser');
    await waitForRunStatus(keel.context.pool, runId, ['waiting_for_approval']);
    await page.goto(`${keel.url}/ui/approvals`);
    const card = page.locator(`.approval[data-run="${runId}"]`);
    expect(await card.textContent()).toContain('send_email');
    expect(await card.textContent()).toContain('ops@example.com');
    await expect.poll(() => page.locator('[data-badge="approvals"]').textContent()).toBe('2');
    await shot('approvals');
    await Promise.all([page.waitForURL(`**/ui/runs/${runId}?flash=approved`), card.locator('button[data-decision="approve"]').click()]);
    // The run page reloads itself as the run moves; it ends completed.
    await waitForRunStatus(keel.context.pool, runId, ['completed', 'failed', 'cancelled']);
    await page.waitForFunction(() => document.querySelector('#run-status')?.textContent?.includes('completed'), undefined, { timeout: 15_000 });
    const run = await getRun(keel.context.pool, runId);
    expect(run).toMatchObject({ status: 'completed', termination_reason: 'completed', tool_calls: 1 });
    expect(await page.textContent('#timeline')).toContain('approval_decided');
    await shot('run');
    await page.goto(`${keel.url}/ui/approvals`);
    expect(await page.locator(`.approval[data-run="${runId}"]`).count()).toBe(0);
  });

  it('resumes a paused push config and its deliveries arrive at the receiver', async () => {
    receiver.setPlan([401, 200]);
    const before = receiver.requests.length;
    const taskId = await sendWithPush(keel, clientToken, 'echo', 'push me', { id: 'ops-hook', url: receiver.url, credentials: CREDENTIAL, token: 'browser-push-token-0001' }, false);
    const configState = () =>
      keel.context.pool.maybeOneFirst(sql.type(z.object({ state: z.string() }))`SELECT state FROM push_configs WHERE task_id = ${taskId} AND id = 'ops-hook'`);
    await waitFor(async () => (await configState()) === 'paused', 'the config to pause');
    expect(receiver.requests.slice(before).map((request) => request.status)).toEqual([401]);

    await page.goto(`${keel.url}/ui/push`);
    const row = page.locator(`#configs-paused tr[data-config="${taskId}/ops-hook"]`);
    expect(await row.textContent()).toContain('authentication failed');
    expect(await row.textContent()).toContain(`Bearer …${CREDENTIAL.slice(-4)}`);
    expect(await page.content()).not.toContain(CREDENTIAL);
    await shot('push-paused');
    await Promise.all([page.waitForURL(`**/ui/push/${taskId}/ops-hook?flash=resumed`), row.locator(`button[data-resume="${taskId}/ops-hook"]`).click()]);

    const total = await keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`
      SELECT count(*)::int AS n FROM push_deliveries WHERE task_id = ${taskId} AND config_id = 'ops-hook'`);
    expect(total).toBeGreaterThanOrEqual(2);
    await waitFor(async () => receiver.requests.slice(before).filter((request) => request.status === 200).length === total, 'every delivery to arrive', 30_000);
    const arrived = receiver.requests.slice(before);
    expect(arrived.every((request) => request.authorization === `Bearer ${CREDENTIAL}`)).toBe(true);
    // The refused event was sent again first, then the rest in journal order, the last one terminal.
    expect(arrived[1]!.body).toEqual(arrived[0]!.body);
    expect(JSON.stringify(arrived.at(-1)!.body)).toContain('TASK_STATE_COMPLETED');
    expect(await configState()).toBe('active');
    // The config's page reloads itself as deliveries end: all delivered.
    await page.waitForFunction(
      (count) => {
        const rows = [...document.querySelectorAll('tr[data-delivery]')];
        return rows.length === count && rows.every((node) => node.getAttribute('data-state') === 'delivered');
      },
      total,
      { timeout: 30_000 },
    );
    expect(await page.textContent('#config-state')).toContain('active');
    await shot('push-config');
  });

  it('saves a screenshot of every page', async () => {
    await page.goto(`${keel.url}/ui/runs`);
    expect(await page.locator('#runs tbody tr').count()).toBeGreaterThanOrEqual(5);
    await shot('runs');
    await page.goto(`${keel.url}/ui/runs?status=failed`);
    expect(await page.locator('#runs tbody tr').count()).toBe(1);
    await page.goto(`${keel.url}/ui/runs?client=browser-client`);
    expect(await page.locator('#runs tbody tr').count()).toBe(2);
    await page.goto(`${keel.url}/ui/dependencies`);
    expect(await page.textContent('h1')).toBe('Dependencies');
    await shot('dependencies');
    await page.goto(`${keel.url}/ui/queues`);
    await page.waitForSelector('text=runs', { timeout: 20_000 });
    await page.waitForTimeout(500);
    await shot('queues');
    // A config in each state for the push page: one whose receiver is gone, one that keeps refusing.
    const gone = await startHookReceiver([404]);
    const refusing = await startHookReceiver([403]);
    try {
      const stoppedTask = await sendWithPush(keel, clientToken, 'echo', 'to a receiver that is gone', { id: 'gone-hook', url: gone.url, credentials: 'gone-credential-1234', token: 'gone-token-1234' }, false);
      const pausedTask = await sendWithPush(keel, clientToken, 'echo', 'to a receiver that refuses', { id: 'billing-hook', url: refusing.url, credentials: 'refused-credential-9876', token: 'refused-token-9876' }, false);
      const stateOf = (taskId: string, id: string) =>
        keel.context.pool.maybeOneFirst(sql.type(z.object({ state: z.string() }))`SELECT state FROM push_configs WHERE task_id = ${taskId} AND id = ${id}`);
      await waitFor(async () => (await stateOf(stoppedTask, 'gone-hook')) === 'stopped' && (await stateOf(pausedTask, 'billing-hook')) === 'paused', 'a stopped and a paused config');
    } finally {
      await gone.close();
      await refusing.close();
    }
    await page.goto(`${keel.url}/ui/push`);
    expect(await page.locator('#configs-paused tr[data-config]').count()).toBe(1);
    expect(await page.locator('#configs-stopped tr[data-config]').count()).toBe(1);
    expect(await page.locator('#configs-active tr[data-config]').count()).toBe(1);
    await shot('push');
    await page.goto(`${keel.url}/ui/machines`);
    await page.waitForFunction(() => document.getElementById('live-stamp')?.textContent?.includes('updated'));
    await shot('machines-final');
    if (process.env.KEEL_DOCS_SCREENSHOTS === '1') {
      mkdirSync(DOCS_IMAGES, { recursive: true });
      const prefix = join(SCREENSHOTS, `${process.env.KEEL_TEST_QUEUE ?? 'postgres'}-`);
      copyFileSync(`${prefix}machines-final.png`, join(DOCS_IMAGES, 'operator-machines.png'));
      copyFileSync(`${prefix}push.png`, join(DOCS_IMAGES, 'operator-push.png'));
    }
  });
});
