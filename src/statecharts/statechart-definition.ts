import { createHash } from 'node:crypto';
import { isAbsolute, resolve } from 'node:path';
import type { AnyStateMachine, AnyStateNode } from 'xstate';
import { canonicalJson } from '../../machines/turn-digest.js';
import { stateNodesOf } from '../../machines/step-machine.js';
import { definitionJson } from './definition-graph.js';
import { stepMarkerOf, type StepMarker } from './steps.js';
import { isMachine } from '../../machines/transitions.js';
import { loadModuleFile } from '../config/import-module-file.js';
import { loadProblem } from '../config/module-load-error.js';

// A statechart agent's machine as Keel loads it at start (docs/statechart-agents.md): the module
// named by the agent's `machine`, its XState machine, what it invokes, and the hash of its
// definition that every run records. A machine Keel could not run durably is refused here, at
// start, with every reason at once, not halfway through a run.

export type StatechartDefinition = {
  machine: AnyStateMachine;
  /** The module as configured (relative to the config file). */
  path: string;
  /** First 16 hex digits of the SHA-256 of the machine's definition (states, transitions, invokes, meta). */
  hash: string;
  /** The Keel step behind each actor the machine invokes, by the name setup({ actors }) gives it. */
  steps: Map<string, StepMarker>;
};

export type LoadStatechartResult = { ok: true; definition: StatechartDefinition } | { ok: false; problems: string[] };

/** The built-in actions a transition may hold; they are carried out by the run, durably. */
const CARRIED_OUT = new Set(['xstate.assign', 'xstate.raise', 'xstate.cancel', 'xstate.emit']);

/**
 * The hash of a machine's definition as Keel stores it (definitionJson: eventless transitions and
 * inline guards included): the same definition always hashes the same, a changed one differently.
 */
export function definitionHash(machine: AnyStateMachine): string {
  return createHash('sha256').update(canonicalJson(definitionJson(machine))).digest('hex').slice(0, 16);
}

/** Checks a machine can run as a statechart agent; returns its steps by actor name, or the reasons it cannot. */
export function checkStatechart(machine: AnyStateMachine, where: string): { ok: true; steps: Map<string, StepMarker> } | { ok: false; problems: string[] } {
  const problems: string[] = [];
  const steps = new Map<string, StepMarker>();
  const actors = machine.implementations.actors as Record<string, unknown>;
  const namedActions = machine.implementations.actions as Record<string, unknown>;

  const checkAction = (action: unknown, at: string): void => {
    if (typeof action === 'string' || (typeof action === 'object' && action !== null && 'type' in action)) {
      const name = typeof action === 'string' ? action : String((action as { type: unknown }).type);
      const implementation = namedActions[name];
      if (implementation === undefined) problems.push(`${at}: action ${name} has no implementation in setup({ actions })`);
      else checkAction(implementation, `${at} (action ${name})`);
      return;
    }
    if (typeof action !== 'function' || !('resolve' in action)) {
      problems.push(`${at}: a custom action ${typeof action === 'function' && action.name ? action.name : '(anonymous)'}: a run carries out only assign, raise, cancel and emit (put effects in a step)`);
      return;
    }
    const type = String((action as { type?: unknown }).type);
    if (!CARRIED_OUT.has(type)) problems.push(`${at}: ${type} is not carried out: only assign, raise, cancel and emit are`);
  };

  for (const node of stateNodesOf(machine.root)) {
    const at = `${where}: state ${node.id}`;
    node.entry.forEach((action) => checkAction(action, `${at} entry`));
    node.exit.forEach((action) => checkAction(action, `${at} exit`));
    const transitions = [...(node.initial ? [node.initial] : []), ...(node.always ?? []), ...[...node.transitions.values()].flat()];
    for (const transition of transitions) {
      for (const action of transition.actions) checkAction(action, `${at} on ${transition.eventType || 'entry'}`);
    }
    const status = (node.meta as { status?: unknown } | undefined)?.status;
    if (status !== undefined && typeof status !== 'string') problems.push(`${at}: meta.status must be a string (the WORKING status message shown on entering it)`);
    for (const invoke of node.invoke) {
      const src = invoke.src as unknown;
      const marker = typeof src === 'string' ? stepMarkerOf(actors[src]) : null;
      if (typeof src !== 'string' || !marker) {
        problems.push(`${at}: invoke ${invoke.id} is not a Keel step: name callModel, callTool, askInput, askApproval, callRemoteAgent or a defineStep() in setup({ actors }) and invoke it by that name`);
        continue;
      }
      if (invoke.systemId !== undefined) problems.push(`${at}: invoke ${invoke.id} has a systemId; a step has none`);
      steps.set(src, marker);
    }
  }
  return problems.length > 0 ? { ok: false, problems } : { ok: true, steps };
}

/** Loads the machine module of an agent (`default` or `machine` export) and checks it. */
export async function loadStatechart(path: string, baseDir: string, where: string): Promise<LoadStatechartResult> {
  const absolute = isAbsolute(path) ? path : resolve(baseDir, path);
  const loaded = await loadModuleFile(absolute);
  if (!loaded.ok) return { ok: false, problems: [loadProblem(`${where}: machine ${path} cannot be loaded`, loaded.text)] };
  const module = loaded.module;
  // The default export, or the one named `machine`, or the module's only exported machine.
  const exported = Object.values(module).filter(isMachine);
  const machine = [module.default, module.machine].find(isMachine) ?? (new Set(exported).size === 1 ? exported[0] : undefined);
  if (!machine) {
    const why = exported.length > 1 ? 'exports several machines and none as default or "machine"' : 'exports no XState machine';
    return { ok: false, problems: [`${where}: machine ${path} ${why} (export it as default or as "machine", made with setup().createMachine())`] };
  }
  const checked = checkStatechart(machine, `${where}: machine ${path}`);
  if (!checked.ok) return checked;
  return { ok: true, definition: { machine, path, hash: definitionHash(machine), steps: checked.steps } };
}

/** The state nodes a state value names, as ids ("refund.classifying"); the ones a definition lacks are the first reason a restored run cannot go on. */
export function stateIdsOf(machine: AnyStateMachine, value: unknown): { ids: string[]; missing: string[] } {
  const ids: string[] = [];
  const missing: string[] = [];
  const walk = (node: AnyStateNode, part: unknown, path: string[]) => {
    if (typeof part === 'string') {
      const child = node.states[part];
      const id = [...path, part].join('.');
      if (child) ids.push(child.id);
      else missing.push(id);
      return;
    }
    if (typeof part === 'object' && part !== null) {
      for (const [key, sub] of Object.entries(part as Record<string, unknown>)) {
        const child = node.states[key];
        const id = [...path, key].join('.');
        if (!child) {
          missing.push(id);
          continue;
        }
        ids.push(child.id);
        walk(child, sub, [...path, key]);
      }
    }
  };
  walk(machine.root, value, []);
  return { ids, missing };
}
