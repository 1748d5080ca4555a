import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setup } from 'xstate';
import { afterAll, describe, expect, it } from 'vitest';
import { runMachine } from '../../../machines/run.machine.js';
import { machineEdges, machineStates } from '../../../machines/transitions.js';
import { escapeHtml, html, raw } from '../../../src/ui/html.js';
import { loadMachineCatalog, machineFiles } from '../../../src/ui/machine-catalog.js';
import { describeMachine, layoutMachine, renderSvg, toMermaid } from '../../../src/ui/statechart.js';

// Diagrams are generated from the machines: every state and transition appears, a state added to a
// machine appears, a machine file added to machines/ is drawn; the layout never overlaps two items.

const scratch = fileURLToPath(new URL(`../../../.tmp/machines-${process.pid}/`, import.meta.url));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

describe('statechart diagrams', () => {
  it('draw every state (with its count and link) and every transition of the run machine', () => {
    const model = describeMachine(runMachine);
    const counts = Object.fromEntries(machineStates(runMachine).map((state, index) => [state, index * 7]));
    const svg = renderSvg(model, { counts, hrefFor: (state) => `/ui/machines/run/${state}` });
    for (const state of machineStates(runMachine)) {
      expect(svg).toContain(`data-state="${state}" data-count="${counts[state]}"`);
      expect(svg).toContain(`href="/ui/machines/run/${state}"`);
    }
    for (const edge of machineEdges(runMachine)) expect(svg).toContain(edge.event);
    const mermaid = toMermaid(model);
    expect(mermaid).toContain('[*] --> queued');
    for (const edge of machineEdges(runMachine)) expect(mermaid).toContain(`${edge.from} --> ${edge.to} : ${edge.event}`);
    for (const state of ['completed', 'failed', 'cancelled']) expect(mermaid).toContain(`${state} --> [*]`);
  });

  it('show a state added to a machine, without anyone drawing it', () => {
    const extended = setup({}).createMachine({
      id: 'extended',
      initial: 'a',
      states: {
        a: { on: { GO: 'b', PARK: 'parked' } },
        parked: { description: 'added later', on: { BACK: 'a' } },
        b: { on: { AGAIN: 'b' } },
        done: { type: 'final' },
      },
    });
    const svg = renderSvg(describeMachine(extended), { counts: { a: 1, parked: 2, b: 3, done: null } });
    expect(svg).toContain('data-state="parked" data-count="2"');
    expect(svg).toContain('>PARK<');
    expect(svg).toContain('>BACK<');
    expect(svg).toContain('>AGAIN<'); // a self-loop
    expect(svg).toContain('data-state="done" data-count=""');
  });

  it('draw one event into a final state from many states once, from a dot its sources join at', () => {
    const model = describeMachine(runMachine);
    const svg = renderSvg(model);
    for (const [event, target] of [['CANCEL', 'cancelled'], ['FAIL [guarded]', 'failed']] as const) {
      const sources = model.edges.filter((edge) => edge.to === target && `${edge.event}${edge.guarded ? ' [guarded]' : ''}` === event).map((edge) => edge.from);
      expect(sources.length).toBeGreaterThanOrEqual(3);
      // The label once, on the dot's one edge; each source joins the dot.
      expect(svg.split(`>${event}<`).length - 1).toBe(1);
      expect(svg).toContain(`<circle class="junction" data-to="${target}" data-event="${event}"`);
      for (const source of sources) expect(svg).toMatch(new RegExp(`class="edge[^"]* grouped" data-from="${source}" data-to-group="${target}"`));
      expect(svg).toContain(`data-from-group="${sources.join(', ')}" data-to="${target}"`);
    }
    // An event into a final state from fewer states keeps its own edge.
    expect(svg).toMatch(/class="edge" data-from="running" data-to="completed"/);
  });

  it('mark a grouped edge taken when a run took one of the transitions it stands for', () => {
    const steps = setup({}).createMachine({
      id: 'steps',
      initial: 'a',
      states: { a: { on: { NEXT: 'b', BROKE: 'failed' } }, b: { on: { NEXT: 'c', BROKE: 'failed' } }, c: { on: { BROKE: 'failed' } }, failed: { type: 'final' } },
    });
    const svg = renderSvg(describeMachine(steps), { path: { visited: ['a', 'b', 'failed'], taken: [{ from: 'a', to: 'b' }, { from: 'b', to: 'failed' }], current: ['failed'] } });
    expect(svg).toMatch(/class="edge grouped taken" data-from="b" data-to-group="failed"/);
    expect(svg).toMatch(/class="edge grouped" data-from="a" data-to-group="failed"/);
    expect(svg).toMatch(/class="edge grouped taken" data-from-group="a, b, c" data-to="failed"/);
    expect(svg).toContain('<circle class="junction taken" data-to="failed" data-event="BROKE"');
  });

  it('never overlap two items of one column', () => {
    for (const machine of [runMachine]) {
      const layout = layoutMachine(describeMachine(machine));
      const items = [...layout.items.values()];
      for (const a of items) {
        for (const b of items) {
          if (a === b || a.column !== b.column) continue;
          const apart = a.y + a.height / 2 <= b.y - b.height / 2 + 0.01 || b.y + b.height / 2 <= a.y - a.height / 2 + 0.01;
          expect(apart, `${a.key} and ${b.key}`).toBe(true);
        }
      }
      expect(layout.width).toBeGreaterThan(0);
      expect(layout.height).toBeGreaterThan(0);
    }
  });

  it('escape what they draw', () => {
    const hostile = setup({}).createMachine({ id: 'x<script>', initial: 's', states: { s: { description: '"><img src=x onerror=alert(1)>', on: { 'E<b>': 't' } }, t: { type: 'final' } } });
    const svg = renderSvg(describeMachine(hostile));
    expect(svg).not.toContain('<script>');
    expect(svg).not.toContain('<img');
    expect(svg).not.toContain('<b>');
  });
});

describe('the machine catalog', () => {
  it('finds every machine file of machines/ (the agent loop is an actor, not a stored lifecycle)', async () => {
    const catalog = await loadMachineCatalog();
    expect(catalog.map((entry) => entry.id)).toEqual(['run', 'task', 'delivery', 'pushConfig', 'dependency']);
    expect(machineFiles().some((file) => file.endsWith('agent-loop.machine.ts'))).toBe(true);
  });

  it('draws a machine file that is added, with no list to update', async () => {
    mkdirSync(scratch, { recursive: true });
    writeFileSync(
      join(scratch, 'refund.machine.ts'),
      `import { setup } from 'xstate';
export const refundMachine = setup({}).createMachine({ id: 'refund', initial: 'requested', states: { requested: { on: { PAY: 'paid' } }, paid: { type: 'final' } } });
`,
    );
    const catalog = await loadMachineCatalog(scratch);
    expect(catalog.map((entry) => entry.id)).toEqual(['refund']);
    expect(catalog[0]!.model.states.map((state) => state.name)).toEqual(['requested', 'paid']);
    expect(renderSvg(catalog[0]!.model)).toContain('>PAY<');
  });
});

describe('html', () => {
  it('escapes interpolations unless they are markup already', () => {
    const name = '<b onclick="x">&\'`';
    expect(html`<p>${name}</p>`.text).toBe('<p>&lt;b onclick=&quot;x&quot;&gt;&amp;&#39;&#96;</p>');
    expect(html`<p>${raw('<i>ok</i>')}${[1, '<', null, undefined, false]}</p>`.text).toBe('<p><i>ok</i>1&lt;</p>');
    expect(escapeHtml('"')).toBe('&quot;');
  });
});
