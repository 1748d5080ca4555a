import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { definitionHash } from '../../../src/statecharts/statechart-definition.js';
import { recordMachineDefinitions } from '../../../src/statecharts/definition-repository.js';
import { loadStatechart } from '../../../src/statecharts/statechart-definition.js';
import { runToEnd, startRun } from '../../support/run-helpers.js';
import { waitForRunStatus } from '../../support/wait-for.js';
import { adminSession, type AdminSession } from '../../support/operator-ui.js';
import { insertMachineRun, recordedDefinitions } from '../../support/statechart-rows.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';
import { machine as refund } from '../../fixtures/statecharts/ui-refund.machine.js';
import { machine as refundV2 } from '../../fixtures/statecharts/ui-refund-v2.machine.js';

// The operator UI of statechart agents, over HTTP: every process records its agents' definitions
// at start; the machines page draws each statechart agent with its open runs per state (live in
// /ui/api/counts too), a state lists its runs, and a run's page draws its machine with the path it
// took and where it stands, on the version it records. The other pages are unchanged.

const V1 = fileURLToPath(new URL('../../fixtures/statecharts/ui-refund.machine.ts', import.meta.url));
const V2 = fileURLToPath(new URL('../../fixtures/statecharts/ui-refund-v2.machine.ts', import.meta.url));
const HASH = definitionHash(refund);
const HASH_V2 = definitionHash(refundV2);

const DONE_CLASSIFY = 'xstate.done.actor.0.refund.classifying';
const DONE_APPROVE = 'xstate.done.actor.0.refund.review.approval';
const DONE_PAY = 'xstate.done.actor.0.refund.paying';
const DONE_ASK = 'xstate.done.actor.0.refund.confirming';

let keel: TestKeel;
let session: AdminSession;
const runs: Record<string, string> = {};

const get = (path: string) => fetch(`${keel.url}${path}`, { headers: { cookie: session.cookie }, redirect: 'manual' });
const text = async (path: string) => {
  const response = await get(path);
  expect(response.status, path).toBe(200);
  return response.text();
};
/** The timeline drawn on a run's page: [kind, label, open] per bar, from each bar's title. */
const drawnTimeline = (page: string) =>
  [...page.matchAll(/<g class="segment" data-kind="([^"]+)" data-open="(true|false)"><title>[^ ]+ ([^<]*?): \+[^<]*<\/title>/g)].map((match) => [match[1], match[3], match[2] === 'true']);
/** The counts drawn on the agent's statechart: state → count. */
const drawnCounts = (page: string, key: string) =>
  Object.fromEntries(
    [...page.matchAll(new RegExp(`data-machine="${key}" data-state="([^"]+)" data-count="(\\d*)"`, 'g'))].map((match) => [match[1]!, match[2] === '' ? null : Number(match[2])]),
  );

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PROVIDERS: { echo: { type: 'echo' } },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'refund', name: 'Refund', machine: V1 },
      ],
    },
  });
  session = await adminSession(keel);
  const pool = keel.context.pool;
  runs.classifyingA = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH, state: 'classifying', steps: [{ state: 'classifying', event: 'xstate.init' }] });
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
  runs.confirming = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH, state: 'confirming' });
  runs.notStarted = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_dependency', hash: null, state: null });
  runs.olderVersion = await insertMachineRun(pool, {
    agent: 'refund',
    status: 'waiting_for_input',
    hash: HASH_V2,
    state: 'notifying',
    steps: [
      { state: 'classifying', event: 'xstate.init' },
      { state: 'paying', event: DONE_CLASSIFY },
      { state: 'notifying', event: DONE_PAY },
    ],
  });
  runs.completed = await insertMachineRun(pool, {
    agent: 'refund',
    status: 'completed',
    hash: HASH,
    state: 'done',
    steps: [
      { state: 'classifying', event: 'xstate.init' },
      { state: { review: 'approval' }, event: DONE_CLASSIFY },
      { state: 'paying', event: DONE_APPROVE },
      { state: 'confirming', event: DONE_PAY },
      { state: 'done', event: DONE_ASK },
    ],
  });
});
afterAll(async () => keel?.dispose());

describe('machine definitions', () => {
  it('are recorded at start, once per version', async () => {
    expect(await recordedDefinitions(keel.context.pool, 'refund')).toEqual([{ hash: HASH, machine: 'refund' }]);
    expect(await recordedDefinitions(keel.context.pool, 'echo')).toEqual([]);
    // Another process with the next version adds it; the same version again adds nothing.
    const loaded = await loadStatechart(V2, '/', 'test');
    if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
    const registry = { agents: new Map([['refund', { statechart: loaded.definition }], ['echo', {}]]) };
    expect(await recordMachineDefinitions(keel.context.pool, registry)).toBe(1);
    expect(await recordMachineDefinitions(keel.context.pool, registry)).toBe(0);
    expect(await recordMachineDefinitions(keel.context.pool, keel.registry)).toBe(0);
    expect((await recordedDefinitions(keel.context.pool, 'refund')).map((row) => row.hash).sort()).toEqual([HASH, HASH_V2].sort());
  });
});

describe('the machines page', () => {
  it('draws the statechart agent with its open runs in each state, beside the lifecycles', async () => {
    const page = await text('/ui/machines');
    expect(page).toContain(`agent refund <span class="muted">(statechart, version <span class="mono" data-version>${HASH}</span>)</span>`);
    expect(drawnCounts(page, 'agent/refund')).toEqual({
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
    expect(page).toContain('data-count-for="agent/refund:#not-started">1<');
    // The run of the next version stands in "notifying", which this version lacks.
    expect(page).toContain('data-count-for="agent/refund:#elsewhere">1<');
    expect(page).toContain('href="/ui/agents/refund/review.approval"');
    expect(page).toContain('state &quot;review.approval&quot; as s_review_approval');
    // The lifecycles are still there, and the echo agent is no statechart.
    expect(page).toContain('data-machine="run" data-state="completed"');
    expect(page).not.toContain('agent/echo');
  });

  it('serves the same counts to the live script', async () => {
    const response = await get('/ui/api/counts');
    expect(response.status).toBe(200);
    const body = (await response.json()) as { counts: Record<string, Record<string, number | null>> };
    expect(body.counts['agent/refund']).toMatchObject({ classifying: 2, review: 1, 'review.approval': 1, confirming: 1, '#not-started': 1, '#elsewhere': 1 });
    expect(body.counts.run).toBeDefined();
  });

  it('lists the open runs of a state, a compound state\'s from anywhere inside it', async () => {
    const classifying = await text('/ui/agents/refund/classifying');
    expect(classifying).toContain('<strong data-state-total>2</strong>');
    expect(classifying).toContain(runs.classifyingA);
    expect(classifying).toContain(runs.classifyingB);
    expect(classifying).not.toContain(runs.completed);
    for (const path of ['/ui/agents/refund/review', '/ui/agents/refund/review.approval']) {
      const page = await text(path);
      expect(page, path).toContain('<strong data-state-total>1</strong>');
      expect(page, path).toContain(runs.review);
    }
    expect(await text('/ui/agents/refund/done')).toContain('<strong data-state-total>0</strong>');
    expect((await get('/ui/agents/refund/no-such-state')).status).toBe(404);
    expect((await get('/ui/agents/echo/classifying')).status).toBe(404);
    expect((await get('/ui/agents/nobody/x')).status).toBe(404);
  });
});

describe('a run\'s page', () => {
  it('draws the machine with the path the run took and where it stands', async () => {
    const page = await text(`/ui/runs/${runs.completed}`);
    expect(page).toContain('<h2 id="run-machine">');
    expect(page).toContain(`version <span class="mono">${HASH}</span>`);
    expect(page).toMatch(/<strong class="mono" id="machine-state">done<\/strong>/);
    for (const state of ['classifying', 'review', 'review.approval', 'review.approved', 'paying', 'confirming']) {
      expect(page, state).toMatch(new RegExp(`<g class="state[^"]* visited"[^>]*data-state="${state.replace('.', '\\.')}"`));
    }
    expect(page).toMatch(/<g class="state final visited current"[^>]*data-state="done"/);
    expect(page).toMatch(/<g class="state final"[^>]*data-state="rejected"/);
    for (const [from, to] of [
      ['classifying', 'review'],
      ['review', 'review.approval'],
      ['review.approval', 'review.approved'],
      ['review', 'paying'],
      ['paying', 'confirming'],
      ['confirming', 'done'],
    ]) {
      expect(page, `${from} -> ${to}`).toMatch(new RegExp(`class="edge[^"]* taken" data-from="${from}" data-to="${to}"`));
    }
    expect(page).toMatch(/class="edge" data-from="classifying" data-to="paying"/);
    // The drawing on a run's page is not one the live counts write into.
    expect(page).toContain('data-machine="path/refund"');
    expect(page).not.toContain('data-machine="agent/refund"');
    const path = [...page.matchAll(/<tr data-sequence="(\d+)">.*?<td class="mono" title="[^"]*">([^<]+)<\/td><td class="mono" data-state="([^"]*)">/g)].map((match) => [
      Number(match[1]),
      match[2],
      match[3],
    ]);
    expect(path).toEqual([
      [0, 'start', 'classifying'],
      [1, 'done(classify)', 'review.approval'],
      [2, 'done(approve)', 'paying'],
      [3, 'done(pay)', 'confirming'],
      [4, 'done(ask)', 'done'],
    ]);
    // The timeline: to scale, the states it went through, one bar each.
    expect(page).toContain('<svg xmlns="http://www.w3.org/2000/svg" id="run-timeline"');
    expect(drawnTimeline(page)).toEqual([
      ['state', 'queued', false],
      ['state', 'classifying', false],
      ['state', 'review.approval', false],
      ['state', 'paying', false],
      ['state', 'confirming', false],
      ['state', 'done', false],
    ]);
  });

  it('of a run the executor drove: its committed transitions drawn as they were written', async () => {
    // classify answers 250 (above 100): the run goes to the review and waits for an operator.
    const id = await startRun(keel, 'refund', 'a large refund');
    const run = await waitForRunStatus(keel.context.pool, id, ['waiting_for_approval', 'failed', 'completed']);
    expect(run).toMatchObject({ status: 'waiting_for_approval', machine_hash: HASH, machine_state: { review: 'approval' } });
    const page = await text(`/ui/runs/${id}`);
    expect(page).toMatch(/id="machine-state">review\.approval</);
    expect(page).toMatch(/<g class="state visited"[^>]*data-state="classifying"/);
    expect(page).toMatch(/<g class="state visited current"[^>]*data-state="review\.approval"/);
    expect(page).toMatch(/class="edge taken" data-from="classifying" data-to="review"/);
    const labels = [...page.matchAll(/<td class="mono" title="[^"]*">([^<]+)<\/td><td class="mono" data-state="([^"]*)">/g)].map((match) => [match[1], match[2]]);
    expect(labels).toEqual([
      ['start', 'classifying'],
      ['done(classify)', 'review.approval'],
    ]);
    expect(drawnCounts(await text('/ui/machines'), 'agent/refund')['review.approval']).toBe(2);
    // Its timeline: the step it took, and the state and the wait it stands in now, open.
    expect(drawnTimeline(page)).toEqual([
      ['state', 'queued', false],
      ['state', 'classifying', false],
      ['step', 'step classify', false],
      ['state', 'review.approval', true],
      ['wait(approval)', 'approval of askApproval', true],
    ]);
    // The approvals page names the state and the step that wait, not a model or a tool; at this
    // run's audit level (metadata, the default) what the step asks is not kept, and it says which setting keeps it.
    const approvals = await text('/ui/approvals');
    const card = approvals.slice(approvals.indexOf(`data-run="${id}"`));
    expect(card.slice(0, card.indexOf('</div>'))).toMatch(
      /The step <strong class="mono" data-step>approve<\/strong>\s+in state <strong class="mono" data-state>review\.approval<\/strong> is waiting for an operator's decision\./,
    );
    expect(card).toContain('this run keeps no content at its audit level (<code>metadata</code>)');
    expect(card.slice(0, card.indexOf('</div>'))).not.toContain('The model asked');
    expect(await text(`/ui/runs/${id}`)).toContain('data-step>approve</strong>');
  });

  it('of a waiting run shows where it stands now', async () => {
    const page = await text(`/ui/runs/${runs.review}`);
    expect(page).toMatch(/id="machine-state">review\.approval</);
    expect(page).toMatch(/<g class="state compound visited current"[^>]*data-state="review"/);
    expect(page).toMatch(/<g class="state visited current"[^>]*data-state="review\.approval"/);
    expect(page).toMatch(/<g class="state"[^>]*data-state="paying"/);
  });

  it('of a run that records another version draws that version, and says so', async () => {
    const page = await text(`/ui/runs/${runs.olderVersion}`);
    expect(page).toContain(`Drawn is version ${HASH_V2}, the one the run went through; this process runs version ${HASH}`);
    expect(page).toMatch(/<g class="state visited current"[^>]*data-state="notifying"/);
    expect(page).toMatch(/class="edge taken" data-from="paying" data-to="notifying"/);
  });

  it('of a run that went on under another version draws the version of its latest transition', async () => {
    const id = await insertMachineRun(keel.context.pool, {
      agent: 'refund',
      status: 'waiting_for_input',
      hash: HASH,
      stepsHash: HASH_V2,
      state: 'notifying',
      steps: [
        { state: 'paying', event: 'xstate.init' },
        { state: 'notifying', event: DONE_PAY },
      ],
    });
    const page = await text(`/ui/runs/${id}`);
    expect(page).toContain(`version <span class="mono">${HASH}</span>`);
    expect(page).toContain(`The run started with version ${HASH}; its latest transition ran on version ${HASH_V2}.`);
    expect(page).toMatch(/<g class="state visited current"[^>]*data-state="notifying"/);
  });

  it('of a run before its first transition, and of an agent that is no statechart', async () => {
    const waiting = await text(`/ui/runs/${runs.notStarted}`);
    expect(waiting).toContain('id="machine-state">no state yet<');
    expect(waiting).toContain('No transition committed yet.');
    const echo = await runToEnd(keel, 'echo', 'plain agent');
    const plain = await text(`/ui/runs/${echo.id}`);
    expect(plain).not.toContain('id="run-machine"');
    expect(plain).toContain('id="timeline"');
  });

  it('leaves the other pages working', async () => {
    for (const path of ['/ui/runs', '/ui/runs?agent=refund', '/ui/approvals', '/ui/push', '/ui/dependencies', '/ui/machines/run/completed']) {
      expect((await get(path)).status, path).toBe(200);
    }
    expect(await text('/ui/runs?agent=refund')).toContain(runs.review);
  });
});
