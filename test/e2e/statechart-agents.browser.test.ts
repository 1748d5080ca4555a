import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { definitionHash } from '../../src/statecharts/statechart-definition.js';
import { createAdminToken } from '../../src/ui/admin-auth.js';
import { insertMachineRun, settleMachineRun } from '../support/statechart-rows.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { machine as refund } from '../fixtures/statecharts/ui-refund.machine.js';
import { launchHeadlessChromium, type HeadlessChromium } from '../support/headless-chromium.js';

// A statechart agent in the operator UI, in a real browser (Debian's Chromium through
// playwright-core, as test/e2e/operator-ui.browser.test.ts): the machines page draws the agent's
// machine with its open runs in each state, and the numbers follow the database without a reload;
// a state lists its runs; a run's page highlights the path the run took and where it stands.
// Screenshots go to test/e2e/screenshots/.

type DomNode = { getAttribute(name: string): string | null; textContent: string | null };
type DomList = Iterable<DomNode> & { forEach(callback: (node: DomNode) => void): void };
declare const document: { querySelectorAll(selector: string): DomList; querySelector(selector: string): DomNode | null };
declare const window: Record<string, unknown> & { getComputedStyle(node: DomNode): { stroke: string; fill: string; fontStyle: string } };

const SCREENSHOTS = fileURLToPath(new URL('./screenshots/', import.meta.url));
const MACHINE = fileURLToPath(new URL('../fixtures/statecharts/ui-refund.machine.ts', import.meta.url));
const TRIAGE = fileURLToPath(new URL('../fixtures/statecharts/ui-triage.machine.ts', import.meta.url));
const HASH = definitionHash(refund);
const DONE_CLASSIFY = 'xstate.done.actor.0.refund.classifying';
const DONE_APPROVE = 'xstate.done.actor.0.refund.review.approval';
const DONE_PAY = 'xstate.done.actor.0.refund.paying';

let keel: TestKeel;
let page: Page;
let browser: HeadlessChromium | undefined;
let adminToken = '';
const runs: Record<string, string> = {};

const shot = async (name: string) => {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${process.env.KEEL_TEST_QUEUE ?? 'postgres'}-statechart-${name}.png`), fullPage: true });
};

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PROVIDERS: { echo: { type: 'echo' } },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'refund', name: 'Refund', machine: MACHINE },
        { id: 'triage', name: 'Triage', machine: TRIAGE },
      ],
    },
  });
  adminToken = (await createAdminToken(keel.context.pool, 'browser')).token;
  const pool = keel.context.pool;
  runs.classifyingA = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH, state: 'classifying' });
  runs.classifyingB = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH, state: 'classifying' });
  runs.review = await insertMachineRun(pool, {
    agent: 'refund',
    status: 'waiting_for_approval',
    hash: HASH,
    state: { review: 'approval' },
    steps: [
      { state: 'classifying', event: 'xstate.init' },
      { state: { review: 'approval' }, event: DONE_CLASSIFY },
    ],
  });
  runs.confirming = await insertMachineRun(pool, {
    agent: 'refund',
    status: 'waiting_for_input',
    hash: HASH,
    state: 'confirming',
    steps: [
      { state: 'classifying', event: 'xstate.init' },
      { state: { review: 'approval' }, event: DONE_CLASSIFY },
      { state: 'paying', event: DONE_APPROVE },
      { state: 'confirming', event: DONE_PAY },
    ],
  });

  browser = await launchHeadlessChromium();
  ({ page } = browser);
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await keel?.dispose();
});

/** The counts drawn on the agent's machine: state → count, as the browser shows them. */
const shownCounts = () =>
  page.evaluate(() => {
    const result: Record<string, number | null> = {};
    document.querySelectorAll('svg.statechart g.state[data-machine="agent/refund"]').forEach((node) => {
      const value = node.getAttribute('data-count');
      result[node.getAttribute('data-state')!] = value === null || value === '' ? null : Number(value);
    });
    return result;
  });
/** The edge labels drawn on a machine's SVG, as the browser shows them. */
const shownLabels = (machine: string) =>
  page.evaluate((id) => {
    const result: string[] = [];
    document.querySelectorAll(`svg.statechart[data-machine="${id}"] g.edge-label text`).forEach((node) => result.push(node.textContent ?? ''));
    return result;
  }, machine);
const shownText = (state: string) => page.textContent(`svg.statechart g.state[data-machine="agent/refund"][data-state="${state}"] .count`);

describe('a statechart agent in the operator UI', () => {
  it('the machines page shows the agent\'s machine with the open runs in each state', async () => {
    await page.goto(`${keel.url}/ui/login`);
    await page.fill('input[name="token"]', adminToken);
    await Promise.all([page.waitForURL(`${keel.url}/ui/machines`), page.click('button[type="submit"]')]);
    const section = page.locator('section[data-machine-section="agent/refund"]');
    expect((await section.locator('h2').textContent())!.replace(/\s+/g, ' ')).toBe(`agent refund (statechart, version ${HASH})`);
    expect(await shownCounts()).toEqual({
      classifying: 2,
      review: 1,
      'review.approval': 1,
      'review.approved': 0,
      paying: 0,
      confirming: 1,
      done: 0,
      rejected: 0,
      failed: 0,
    });
    expect(await shownText('classifying')).toBe('2');
    // The team's agents come first, Keel's built-in lifecycles after them.
    const sections = await page.evaluate(() => {
      const result: string[] = [];
      document.querySelectorAll('section.machine').forEach((node) => result.push(node.getAttribute('data-machine-section')!));
      return result;
    });
    expect(sections.slice(0, 2)).toEqual(['agent/refund', 'agent/triage']);
    expect(sections.slice(2)).toContain('run');
    expect(await page.evaluate(() => [...(document.querySelectorAll('h2#statechart-agents, h2#built-in-lifecycles') as unknown as Iterable<{ id: string }>)].map((node) => node.id))).toEqual([
      'statechart-agents',
      'built-in-lifecycles',
    ]);
    // Edges are named by the machine: the invoke's id, not the step it runs; guards by name; a delay by its duration.
    const triage = await shownLabels('agent/triage');
    expect(triage.sort()).toEqual(
      ['done(classify) [and(urgent, known)], done(classify) [known]', 'done(classify)', 'error(classify)', 'after(5s)', 'after(reminder 5s)', 'done(file) [urgent]', 'error(file)'].sort(),
    );
    expect(triage.join(' ')).not.toContain('callTool');
    expect((await page.locator('svg.statechart[data-machine="agent/triage"] g.edge-label.guarded text').allTextContents()).sort()).toEqual([
      'done(classify) [and(urgent, known)], done(classify) [known]',
      'done(file) [urgent]',
    ]);
    // Guarded labels are drawn in italics.
    expect(await page.evaluate(() => window.getComputedStyle(document.querySelector('svg.statechart[data-machine="agent/triage"] g.edge-label.guarded text')!).fontStyle)).toBe('italic');
    expect(await shownLabels('agent/refund')).toEqual(expect.arrayContaining(['done(classify) [large]', 'done(approve) [approved]', 'done(ask), after(1h)']));
    // The run lifecycle: CANCEL and FAIL are drawn once each, from a dot the states they leave join at.
    const run = await shownLabels('run');
    expect(run.filter((label) => label === 'CANCEL')).toHaveLength(1);
    expect(run.filter((label) => label === 'FAIL [guarded]')).toHaveLength(1);
    expect(await page.locator('svg.statechart[data-machine="run"] circle.junction[data-to="cancelled"]').count()).toBe(1);
    expect(await page.locator('svg.statechart[data-machine="run"] path.edge.grouped[data-to-group="cancelled"]').count()).toBeGreaterThanOrEqual(3);
    expect(await page.locator('svg.statechart g.state[data-machine="run"]').count()).toBeGreaterThan(5);
    await page.waitForFunction(() => document.querySelector('#live-stamp')?.textContent?.includes('updated'));
    await section.scrollIntoViewIfNeeded();
    await shot('machines');
  });

  it('follows the database without a reload', async () => {
    await page.evaluate(() => (window.notReloaded = true));
    runs.paying = await insertMachineRun(keel.context.pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH, state: 'paying' });
    await settleMachineRun(keel.context.pool, runs.classifyingB, 'done');
    await page.waitForFunction(
      () =>
        document.querySelector('svg.statechart g.state[data-machine="agent/refund"][data-state="paying"]')?.getAttribute('data-count') === '1' &&
        document.querySelector('svg.statechart g.state[data-machine="agent/refund"][data-state="classifying"]')?.getAttribute('data-count') === '1',
    );
    expect(await page.evaluate(() => window.notReloaded)).toBe(true);
    expect(await shownText('paying')).toBe('1');
    expect(await shownText('classifying')).toBe('1');
    // A run not started yet is counted apart.
    await insertMachineRun(keel.context.pool, { agent: 'refund', status: 'waiting_for_dependency', hash: null, state: null });
    await page.waitForFunction(() => document.querySelector('[data-count-for="agent/refund:#not-started"]')?.textContent === '1');
  });

  it('a state lists its runs, and a run\'s page shows the path it took and where it stands', async () => {
    await Promise.all([
      page.waitForURL('**/ui/agents/refund/review.approval'),
      page.click('svg.statechart g.state[data-machine="agent/refund"][data-state="review.approval"]'),
    ]);
    expect(await page.textContent('[data-state-total]')).toBe('1');
    await Promise.all([page.waitForURL(`**/ui/runs/${runs.review}`), page.click(`tr[data-run="${runs.review}"] a`)]);
    expect(await page.textContent('#machine-state')).toBe('review.approval');
    const classes = () =>
      page.evaluate(() => {
        const result: Record<string, string> = {};
        document.querySelectorAll('#run-machine ~ svg.statechart g.state').forEach((node) => (result[node.getAttribute('data-state')!] = node.getAttribute('class')!));
        return result;
      });
    expect(await classes()).toMatchObject({
      classifying: 'state visited',
      review: 'state compound visited current',
      'review.approval': 'state visited current',
      paying: 'state',
      confirming: 'state',
    });

    await page.goto(`${keel.url}/ui/runs/${runs.confirming}`);
    expect(await page.textContent('#machine-state')).toBe('confirming');
    const taken = await page.evaluate(() => {
      const result: string[] = [];
      document.querySelectorAll('svg.statechart path.edge.taken[data-from]').forEach((node) => result.push(`${node.getAttribute('data-from')}->${node.getAttribute('data-to')}`));
      return result;
    });
    expect(taken.sort()).toEqual(['classifying->review', 'paying->confirming', 'review->paying', 'review->review.approval', 'review.approval->review.approved'].sort());
    // And the arrow into the initial state, where it started.
    expect(await page.locator('svg.statechart path.edge.taken:not([data-from])').count()).toBe(1);
    // The highlight is drawn: taken edges and visited states in green, the current state in orange.
    const colours = await page.evaluate(() => ({
      taken: window.getComputedStyle(document.querySelector('svg.statechart path.edge.taken[data-from="paying"]')!).stroke,
      other: window.getComputedStyle(document.querySelector('svg.statechart path.edge[data-from="classifying"][data-to="paying"]')!).stroke,
      visited: window.getComputedStyle(document.querySelector('svg.statechart g.state[data-state="paying"] .box')!).fill,
      current: window.getComputedStyle(document.querySelector('svg.statechart g.state[data-state="confirming"] .box')!).fill,
    }));
    expect(colours).toEqual({ taken: 'rgb(47, 138, 76)', other: 'rgb(122, 132, 148)', visited: 'rgb(227, 243, 232)', current: 'rgb(255, 240, 212)' });
    expect(await page.locator('#machine-path tbody tr').count()).toBe(4);
    expect(await page.locator('#machine-path tbody tr').last().textContent()).toContain('done(pay)');
    // The timeline: a bar per segment, to scale, the state it stands in now open at the right.
    const bars = await page.evaluate(() => {
      const result: Array<{ kind: string | null; label: string; open: string | null; x: number; width: number }> = [];
      document.querySelectorAll('#run-timeline g.segment').forEach((node) => {
        const bar = (node as unknown as { querySelector(selector: string): { getBoundingClientRect(): { x: number; width: number } } }).querySelector('rect').getBoundingClientRect();
        result.push({ kind: node.getAttribute('data-kind'), label: node.textContent!.split(':')[0]!, open: node.getAttribute('data-open'), x: bar.x, width: bar.width });
      });
      return result;
    });
    expect(bars.map((bar) => [bar.kind, bar.open])).toEqual([
      ['state', 'false'],
      ['state', 'false'],
      ['state', 'false'],
      ['state', 'false'],
      ['state', 'true'],
    ]);
    expect(bars.map((bar) => bar.label)).toEqual(['state queued', 'state classifying', 'state review.approval', 'state paying', 'state confirming']);
    // The path's transitions are a second apart: the states follow each other left to right, each drawn.
    for (const [index, bar] of bars.entries()) {
      expect(bar.width).toBeGreaterThan(0);
      if (index > 1) expect(bar.x).toBeGreaterThan(bars[index - 1]!.x);
    }
    await page.locator('#run-timeline').scrollIntoViewIfNeeded();
    await shot('run');
  });
});
