import { setup } from 'xstate';
import { describe, expect, it } from 'vitest';
import { runMachine } from '../../../machines/run.machine.js';
import {
  activePaths,
  countRunsInStates,
  definitionJson,
  diffDefinitions,
  graphOfMachine,
  leafPaths,
  orphanedSteps,
  readDefinitionGraph,
  runPathOf,
  stateText,
  transitionText,
} from '../../../src/statecharts/definition-graph.js';
import { defineStep } from '../../../src/statecharts/steps.js';
import { describeGraph, describeMachine, renderSvg, toMermaid } from '../../../src/ui/statechart.js';
import { machine as refund } from '../../fixtures/statecharts/ui-refund.machine.js';
import { machine as refundV2 } from '../../fixtures/statecharts/ui-refund-v2.machine.js';
import { machine as triage } from '../../fixtures/statecharts/ui-triage.machine.js';

// A statechart agent's machine as the operator surfaces read it: its states by path (nested ones
// included), its transitions with readable labels, the runs counted per state, a run's path from
// its committed transitions, what changed between two definitions, and the drawing of all that.

const DONE_CLASSIFY = 'xstate.done.actor.0.refund.classifying';
const DONE_APPROVE = 'xstate.done.actor.0.refund.review.approval';
const DONE_PAY = 'xstate.done.actor.0.refund.paying';

/** A machine with what the refund fixture lacks: a transition on the machine itself, an eventless one with an inline guard, a parallel state, a custom id. */
const odd = setup({ actors: { work: defineStep({ effect: 'read_only', run: async () => 1 }) } }).createMachine({
  id: 'odd',
  initial: 'start',
  on: { RESET: '.start' },
  states: {
    start: { always: [{ target: 'both', guard: function ready() { return true; } }] },
    both: {
      type: 'parallel',
      states: {
        left: { initial: 'l1', states: { l1: { invoke: { src: 'work', id: 'lefty', onDone: 'l2' } }, l2: { after: { 500: 'l1' } } } },
        right: { id: 'custom-right', initial: 'r1', states: { r1: { on: { GO: '#odd.end' } } } },
      },
    },
    end: { type: 'final' },
  },
});

describe('the definition graph', () => {
  it('names every state by its path, with its kind, and labels transitions as an operator reads them', () => {
    const graph = graphOfMachine(refund);
    expect(graph.initial).toBe('classifying');
    expect(graph.states.map((state) => [state.path, state.kind])).toEqual([
      ['classifying', 'atomic'],
      ['review', 'compound'],
      ['review.approval', 'atomic'],
      ['review.approved', 'final'],
      ['paying', 'atomic'],
      ['confirming', 'atomic'],
      ['done', 'final'],
      ['rejected', 'final'],
      ['failed', 'final'],
    ]);
    expect(graph.states.find((state) => state.path === 'paying')!.status).toBe('Paying');
    expect(graph.edges.map(transitionText)).toEqual([
      'classifying --done(classify)--> review [large]',
      'classifying --done(classify)--> paying',
      'classifying --error(classify)--> failed',
      'review --done--> paying',
      'review --initial--> review.approval',
      'review.approval --done(approve)--> review.approved [approved]',
      'review.approval --done(approve)--> rejected',
      'paying --done(pay)--> confirming',
      'paying --error(pay)--> failed',
      'confirming --done(ask)--> done',
      'confirming --after(1h)--> done',
    ]);
    // The raw event types are the ones a run's path records.
    expect(graph.edges.filter((edge) => edge.event === DONE_CLASSIFY).map((edge) => edge.to)).toEqual(['review', 'paying']);
    expect(graph.edges.find((edge) => edge.label === 'initial')!.nest).toBe(true);
  });

  it('keeps what machine.definition leaves out: eventless transitions and inline guards; the machine\'s own transitions leave from "*"', () => {
    const graph = graphOfMachine(odd);
    expect(graph.edges.map(transitionText)).toEqual([
      '* --RESET--> start',
      'start --always--> both [ready]',
      'both --parallel--> both.left',
      'both --parallel--> both.right',
      'both.left --initial--> both.left.l1',
      'both.left.l1 --done(lefty)--> both.left.l2',
      'both.left.l2 --after(500ms)--> both.left.l1',
      'both.right --initial--> both.right.r1',
      'both.right.r1 --GO--> end',
    ]);
    expect(graph.states.find((state) => state.path === 'both')!.kind).toBe('parallel');
    // machine.definition alone has no `always`: the stored JSON adds it, and reads back the same.
    expect(JSON.stringify(odd.definition)).not.toContain('"always"');
    const stored = JSON.parse(JSON.stringify(definitionJson(odd))) as unknown;
    expect(readDefinitionGraph(stored)).toEqual(graph);
    expect(readDefinitionGraph({ not: 'a machine' })).toBeNull();
    expect(readDefinitionGraph(null)).toBeNull();
  });

  it('names transitions with the machine\'s own names: the invoke\'s id, the guard, the delay\'s duration', () => {
    // Two states running the same step (callTool) under ids of their own, as a team writes a triage agent.
    const graph = graphOfMachine(triage);
    expect(graph.edges.map(transitionText)).toEqual([
      'classifying --done(classify)--> filing [and(urgent, known)]',
      'classifying --done(classify)--> filing [known]',
      'classifying --done(classify)--> waiting',
      'classifying --error(classify)--> failed',
      'waiting --after(5s)--> filing',
      'waiting --after(reminder 5s)--> classifying',
      'filing --done(file)--> done [urgent]',
      'filing --error(file)--> failed',
    ]);
    expect(graph.edges.map((edge) => edge.guard)).toEqual(['and(urgent, known)', 'known', null, null, null, null, 'urgent', null]);
    expect(graph.edges.map((edge) => edge.label).join(' ')).not.toContain('callTool');
    // The stored definition keeps the names and the named delay's duration.
    expect(readDefinitionGraph(JSON.parse(JSON.stringify(definitionJson(triage))) as unknown)).toEqual(graph);
    // Drawn: labels with their guards, and no step name where the machine gave ids.
    const svg = renderSvg(describeGraph(graph));
    for (const label of ['done(classify) [and(urgent, known)], done(classify) [known]', 'done(classify)', 'done(file) [urgent]', 'after(5s)', 'after(reminder 5s)']) expect(svg).toContain(`>${label}<`);
    expect(svg).not.toContain('callTool');
    expect(toMermaid(describeGraph(graph))).toContain('filing --> done : done(file) [urgent]');
  });

  it('reads the states a state value stands in, nested and parallel', () => {
    expect(activePaths('classifying')).toEqual(['classifying']);
    expect(activePaths({ review: 'approval' })).toEqual(['review', 'review.approval']);
    expect(activePaths({ both: { left: 'l2', right: 'r1' } })).toEqual(['both', 'both.left', 'both.left.l2', 'both.right', 'both.right.r1']);
    expect(leafPaths({ both: { left: 'l2', right: 'r1' } })).toEqual(['both.left.l2', 'both.right.r1']);
    expect(stateText({ review: 'approval' })).toBe('review.approval');
    expect(stateText(null)).toBe('–');
    expect(activePaths(null)).toEqual([]);
  });

  it('counts a run in its leaf state and in each compound state around it; runs not started or in unknown states apart', () => {
    const counts = countRunsInStates(graphOfMachine(refund), [
      { state: 'classifying', n: 2 },
      { state: { review: 'approval' }, n: 3 },
      { state: { review: 'approved' }, n: 1 },
      { state: 'confirming', n: 1 },
      { state: 'gone', n: 4 },
      { state: { review: 'elsewhere' }, n: 1 },
      { state: null, n: 5 },
    ]);
    expect(counts.states).toEqual({
      classifying: 2,
      review: 4,
      'review.approval': 3,
      'review.approved': 1,
      paying: 0,
      confirming: 1,
      done: 0,
      rejected: 0,
      failed: 0,
    });
    expect(counts.notStarted).toBe(5);
    expect(counts.elsewhere).toBe(5);
  });

  it('follows a run\'s committed transitions: the states it stood in and the transitions it took, through a compound state\'s done', () => {
    const graph = graphOfMachine(refund);
    const path = runPathOf(graph, [
      { sequence: 0, state: 'classifying', event: 'xstate.init', at: 1000 },
      { sequence: 1, state: { review: 'approval' }, event: DONE_CLASSIFY, at: 2000 },
      // The approval's done reaches review.approved, whose done leads on to paying in the same macrostep.
      { sequence: 2, state: 'paying', event: DONE_APPROVE, at: 3000 },
      { sequence: 3, state: 'confirming', event: DONE_PAY, at: 4000 },
    ]);
    expect(path.visited).toEqual(['classifying', 'review', 'review.approval', 'review.approved', 'paying', 'confirming']);
    expect(path.taken.map((edge) => `${edge.from}->${edge.to}`)).toEqual([
      'classifying->review',
      'review->review.approval',
      'review.approval->review.approved',
      'review->paying',
      'paying->confirming',
    ]);
    expect(path.steps.map((step) => [step.sequence, step.label, step.state])).toEqual([
      [0, 'start', 'classifying'],
      [1, 'done(classify)', 'review.approval'],
      [2, 'done(approve)', 'paying'],
      [3, 'done(pay)', 'confirming'],
    ]);
    // A step the graph has no transition for (another definition) still marks where it went.
    const strange = runPathOf(graph, [{ sequence: 0, state: 'paying', event: 'xstate.done.actor.elsewhere' }]);
    expect(strange.visited).toEqual(['paying']);
    expect(strange.taken).toEqual([]);
  });

  it('says what changed between two definitions', () => {
    const diff = diffDefinitions(graphOfMachine(refund), graphOfMachine(refundV2));
    expect(diff).toEqual({
      statesAdded: ['notifying'],
      statesRemoved: ['confirming'],
      transitionsAdded: ['notifying --done(notify)--> done', 'paying --done(pay)--> notifying'],
      transitionsRemoved: ['confirming --after(1h)--> done', 'confirming --done(ask)--> done', 'paying --done(pay)--> confirming'],
      invokesChanged: [],
    });
    expect(diffDefinitions(graphOfMachine(refund), graphOfMachine(refund))).toEqual({ statesAdded: [], statesRemoved: [], transitionsAdded: [], transitionsRemoved: [], invokesChanged: [] });
    // A step renamed is a changed transition, and so is an invoke given an id of its own (the label names it by that id).
    const renamed = setup({ actors: { work: defineStep({ effect: 'read_only', run: async () => 1 }), other: defineStep({ effect: 'read_only', run: async () => 1 }) } });
    const a = renamed.createMachine({ id: 'm', initial: 'x', states: { x: { invoke: { src: 'work', onDone: 'y' } }, y: { type: 'final' } } });
    const b = renamed.createMachine({ id: 'm', initial: 'x', states: { x: { invoke: { src: 'work', id: 'named', onDone: 'y' } }, y: { type: 'final' } } });
    const c = renamed.createMachine({ id: 'm', initial: 'x', states: { x: { invoke: { src: 'other', onDone: 'y' } }, y: { type: 'final' } } });
    expect(diffDefinitions(graphOfMachine(a), graphOfMachine(b))).toMatchObject({ transitionsAdded: ['x --done(named)--> y'], transitionsRemoved: ['x --done(work)--> y'] });
    expect(diffDefinitions(graphOfMachine(a), graphOfMachine(c))).toMatchObject({ transitionsAdded: ['x --done(other)--> y'], transitionsRemoved: ['x --done(work)--> y'] });
    // But an invoke's new id is a change: a run waiting in x on the old id cannot get its answer.
    expect(diffDefinitions(graphOfMachine(a), graphOfMachine(b)).invokesChanged).toEqual(['x: work (id 0.m.x) -> work (id named)']);
    expect(orphanedSteps(graphOfMachine(a), graphOfMachine(b), 'x')).toEqual(['x: work (id 0.m.x)']);
    expect(orphanedSteps(graphOfMachine(a), graphOfMachine(a), 'x')).toEqual([]);
    expect(orphanedSteps(graphOfMachine(a), graphOfMachine(b), 'y')).toEqual([]);
    expect(orphanedSteps(graphOfMachine(refund), graphOfMachine(refundV2), { review: 'approval' })).toEqual([]);
  });
});

describe('drawing a statechart agent', () => {
  it('draws every state by its path with its count, and every transition by its label', () => {
    const model = describeGraph(graphOfMachine(refund), 'agent/refund');
    const counts = Object.fromEntries(model.states.map((state, index) => [state.name, index]));
    const svg = renderSvg(model, { counts, hrefFor: (state) => `/ui/agents/refund/${state}` });
    for (const state of model.states) {
      expect(svg).toContain(`data-machine="agent/refund" data-state="${state.name}" data-count="${counts[state.name]}"`);
      expect(svg).toContain(`href="/ui/agents/refund/${state.name}"`);
    }
    for (const label of ['done(classify)', 'done(classify) [large]', 'error(classify)', 'done(approve) [approved]', 'done(ask), after(1h)', 'initial']) expect(svg).toContain(`>${label}<`);
    expect(svg).toMatch(/<g class="state compound busy"[^>]*data-state="review" data-count="1"/);
    expect(svg).toMatch(/class="edge[^"]* nest"[^>]*data-from="review" data-to="review.approval"/);
    // Mermaid takes a path as a declared id.
    const mermaid = toMermaid(model);
    expect(mermaid).toContain('state "review.approval" as s_review_approval');
    expect(mermaid).toContain('s_review_approval --> s_review_approved : done(approve) [approved]');
    expect(mermaid).toContain('[*] --> classifying');
  });

  it('highlights a run\'s path and where it stands', () => {
    const graph = graphOfMachine(refund);
    const path = runPathOf(graph, [
      { sequence: 0, state: 'classifying', event: 'xstate.init' },
      { sequence: 1, state: { review: 'approval' }, event: DONE_CLASSIFY },
    ]);
    const svg = renderSvg(describeGraph(graph, 'path/refund'), { path: { visited: path.visited, taken: path.taken, current: activePaths({ review: 'approval' }) } });
    expect(svg).toMatch(/<g class="state visited"[^>]*data-state="classifying"/);
    expect(svg).toMatch(/<g class="state compound visited current"[^>]*data-state="review"/);
    expect(svg).toMatch(/<g class="state visited current"[^>]*data-state="review.approval"/);
    expect(svg).toMatch(/<g class="state"[^>]*data-state="paying"/);
    expect(svg).toMatch(/class="edge taken" data-from="classifying" data-to="review"/);
    expect(svg).toMatch(/class="edge nest taken" data-from="review" data-to="review.approval"/);
    expect(svg).toMatch(/class="edge" data-from="classifying" data-to="paying"/);
    expect(svg).toContain('-arrow-taken');
  });

  it('draws the machine\'s own transitions from a pseudo-state that is never counted', () => {
    const model = describeMachine(odd);
    expect(model.states[0]).toMatchObject({ name: '*', kind: 'any' });
    const svg = renderSvg(model, { counts: Object.fromEntries(model.states.map((state) => [state.name, 1])), hrefFor: (state) => `/x/${state}` });
    expect(svg).toMatch(/<g class="state any" data-state="\*">/);
    expect(svg).not.toContain('href="/x/*"');
  });

  it('leaves the flat lifecycle machines as they were drawn', () => {
    const model = describeMachine(runMachine);
    expect(model.states.every((state) => state.kind === undefined)).toBe(true);
    expect(model.edges.every((edge) => edge.label === undefined)).toBe(true);
    expect(toMermaid(model)).not.toContain('state "');
  });
});
