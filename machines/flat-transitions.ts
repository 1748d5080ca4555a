import type { AnyStateMachine, AnyStateNode, StateValue } from 'xstate';

// The transitions of a flat machine, read once from the machine's own state nodes and computed
// without building a snapshot object, a child actor or an action list per microstep (decision
// 0032). A flat machine is one XState itself would run as: the root, whose children are atomic or
// final states, each with at most invokes of named actors, guarded `onDone` / `onError` and eventless
// transitions, and `assign` actions on them. That is the agent loop. Everything else (nested or
// parallel states, history, entry and exit actions, raise, wildcard events, self-targeting or
// empty transitions, higher-order guards) is refused with its reason, and the stepper then computes
// that machine with XState's own `transition`.
//
// Each step below is the part of XState 5's macrostep that a flat machine can reach, in XState's
// order: an event's first enabled candidate (document order) in the atomic state; its microstep
// (stop the source's invokes, the transition's assigns, start the target's invokes with the context
// the assigns left); then eventless transitions of the state the machine is in, the first enabled
// one each time, with the macrostep's event, until none is enabled or a final state is entered; an
// actor error no transition takes ends the machine in error with that error. The property tests in
// test/unit/machines/step-machine.test.ts hold it to XState's own computation and to the actor path.

/** What the stepper reads of a snapshot; XState's own snapshots have these fields too. */
export type StepSnapshot = {
  status: 'active' | 'done' | 'error';
  value: StateValue;
  context: unknown;
  output?: unknown;
  error?: unknown;
};

export type StepEvent = { type: string; [key: string]: unknown };

/** An effect the stepper carries out: start a step for an invoke, or drop one whose state was left. */
export type StepEffect =
  | { type: 'xstate.spawnChild'; params: { id: string; src: string; input: unknown } }
  | { type: 'xstate.stopChild'; params: { id: string } };

export type ComputedStep = [StepSnapshot, StepEffect[]];

export type MachineTransitions = {
  initial: (input: unknown) => ComputedStep;
  next: (snapshot: StepSnapshot, event: StepEvent) => ComputedStep;
};

export type FlatCompilation = { flat: true; transitions: MachineTransitions } | { flat: false; reasons: string[] };

type Args = { context: unknown; event: StepEvent };
type GuardCheck = (context: unknown, event: StepEvent) => boolean;
type ContextUpdate = (context: unknown, event: StepEvent) => unknown;

type FlatTransition = { guard: GuardCheck | null; guardName: string | undefined; target: FlatState | null; updates: ContextUpdate[] };

type FlatState = {
  key: string;
  node: AnyStateNode;
  final: boolean;
  invokes: { id: string; src: string; input: unknown }[];
  always: FlatTransition[];
  /** Exact event type to its candidates in document order. */
  on: Map<string, FlatTransition[]>;
};

/** What assign, guard and input functions get as `self`, `system` and `spawn` in a stepped run. */
type Host = { self: unknown; system: unknown };

/** A guard or action written by name, as a string or `{ type, params }`: its name and params (none inline). */
function referenceOf(value: unknown): { name: string | undefined; params: unknown } {
  if (typeof value === 'string') return { name: value, params: undefined };
  if (typeof value === 'object' && value !== null && 'type' in value) {
    return { name: String(value.type), params: 'params' in value ? value.params : undefined };
  }
  return { name: undefined, params: undefined };
}

export function compileFlatTransitions(machine: AnyStateMachine, host: Host): FlatCompilation {
  const reasons: string[] = [];
  const root = machine.root;
  const guards = machine.implementations.guards as Record<string, unknown>;
  const actions = machine.implementations.actions as Record<string, unknown>;
  const spawn = () => {
    throw new Error(`machine ${machine.id}: spawn is not carried out by a stepped run`);
  };

  const rootTransitions = [...root.transitions.values()].flat();
  if (root.entry.length > 0 || root.exit.length > 0) reasons.push('the root has entry or exit actions');
  if (root.invoke.length > 0) reasons.push('the root invokes');
  if ((root.always ?? []).length > 0 || rootTransitions.length > 0) reasons.push('the root has transitions of its own');
  if (root.after.length > 0) reasons.push('the root has delayed transitions');
  if (root.type !== 'compound' || !root.initial) reasons.push(`the root is ${root.type}, not compound with an initial state`);
  else if (root.initial.actions.length > 0) reasons.push('the initial transition has actions');
  if (reasons.length > 0) return { flat: false, reasons };

  const compileGuard = (guard: unknown, where: string): GuardCheck | null => {
    if (guard === undefined) return null;
    if (typeof guard === 'function') {
      if ('check' in guard) {
        reasons.push(`${where}: a higher-order guard`);
        return null;
      }
      const inline = guard as (args: Args, params: unknown) => boolean;
      return (context, event) => inline({ context, event }, undefined);
    }
    const { name, params } = referenceOf(guard);
    const implementation = name === undefined ? undefined : guards[name];
    if (typeof implementation !== 'function' || 'check' in implementation) {
      reasons.push(`${where}: guard ${String(name)} is not a plain function in setup({ guards })`);
      return null;
    }
    const named = implementation as (args: Args, params: unknown) => boolean;
    if (typeof params === 'function') return (context, event) => named({ context, event }, params({ context, event }));
    return (context, event) => named({ context, event }, params);
  };

  const compileAction = (action: unknown, where: string): ContextUpdate | null => {
    const inline = typeof action === 'function';
    const { name, params } = inline ? { name: undefined, params: undefined } : referenceOf(action);
    const resolved = inline ? action : name === undefined ? undefined : actions[name];
    const assignment = (resolved as { type?: unknown; assignment?: unknown } | undefined)?.type === 'xstate.assign' ? (resolved as { assignment: unknown }).assignment : undefined;
    if (assignment === undefined) {
      reasons.push(`${where}: only assign actions are computed here`);
      return null;
    }
    const paramsOf = typeof params === 'function' ? (context: unknown, event: StepEvent) => params({ context, event }) : () => params;
    // As XState's resolveAssign: every property function sees the context from before this assign.
    const partialOf = (context: unknown, event: StepEvent): unknown => {
      const args = { context, event, spawn, self: host.self, system: host.system };
      const actionParams = paramsOf(context, event);
      if (typeof assignment === 'function') return assignment(args, actionParams);
      const partial: Record<string, unknown> = {};
      for (const key of Object.keys(assignment as object)) {
        const property = (assignment as Record<string, unknown>)[key];
        partial[key] = typeof property === 'function' ? property(args, actionParams) : property;
      }
      return partial;
    };
    return (context, event) => Object.assign({}, context, partialOf(context, event));
  };

  const states = new Map<AnyStateNode, FlatState>();
  for (const [key, node] of Object.entries(root.states) as [string, AnyStateNode][]) {
    const where = `state ${node.id}`;
    if (node.type !== 'atomic' && node.type !== 'final') reasons.push(`${where} is ${node.type}`);
    if (node.entry.length > 0 || node.exit.length > 0) reasons.push(`${where} has entry or exit actions`);
    if (node.after.length > 0) reasons.push(`${where} has delayed transitions`);
    if (node.type === 'final' && (node.invoke.length > 0 || (node.always ?? []).length > 0)) reasons.push(`${where} is final and invokes or moves on`);
    // Invokes of inline logic were refused when the stepper was made (checkSteppable).
    const invokes = node.invoke.map((invoke) => ({ id: invoke.id, src: String(invoke.src), input: invoke.input as unknown }));
    states.set(node, { key, node, final: node.type === 'final', invokes, always: [], on: new Map() });
  }

  const compileTransition = (transition: { target?: readonly AnyStateNode[] | undefined; actions: readonly unknown[]; guard?: unknown; reenter?: boolean }, source: FlatState, where: string): FlatTransition => {
    const targets = transition.target ?? [];
    if (targets.length > 1) reasons.push(`${where}: more than one target`);
    const target = targets[0] === undefined ? null : (states.get(targets[0]) ?? null);
    if (targets[0] !== undefined && target === null) reasons.push(`${where}: a target that is not a state of the root`);
    if (target === source) reasons.push(`${where}: a transition to its own state`);
    if (target === null && transition.actions.length === 0) reasons.push(`${where}: a transition that neither moves nor acts`);
    const updates = transition.actions.map((action) => compileAction(action, where)).filter((update): update is ContextUpdate => update !== null);
    return { guard: compileGuard(transition.guard, where), guardName: referenceOf(transition.guard).name, target, updates };
  };

  for (const state of states.values()) {
    const where = `state ${state.node.id}`;
    state.always = (state.node.always ?? []).map((transition) => compileTransition(transition, state, `${where} always`));
    for (const [eventType, candidates] of state.node.transitions) {
      if (eventType.includes('*')) reasons.push(`${where}: a wildcard event ${eventType}`);
      state.on.set(eventType, candidates.map((transition) => compileTransition(transition, state, `${where} on ${eventType}`)));
    }
  }
  const initialNode = root.initial?.target[0];
  const initialState = initialNode ? states.get(initialNode) : undefined;
  if (!initialState) reasons.push('the initial state is not a state of the root');
  if (reasons.length > 0 || !initialState) return { flat: false, reasons };

  const contextConfig = (machine.config as { context?: unknown }).context;
  const rootOutput = root.output as unknown;
  const maxIterations = (machine as { options?: { maxIterations?: number } }).options?.maxIterations ?? Infinity;
  const byKey = new Map([...states.values()].map((state) => [state.key, state]));

  const outputOf = (mapper: unknown, context: unknown, event: unknown): unknown =>
    typeof mapper === 'function' ? mapper({ context, event, self: host.self }) : mapper;

  /** Enters `state`: starts its invokes, or ends the machine when it is final. */
  const enter = (state: FlatState, context: unknown, event: StepEvent, effects: StepEffect[]): StepSnapshot => {
    for (const invoke of state.invokes) {
      const input = typeof invoke.input === 'function' ? invoke.input({ context, event, self: host.self }) : invoke.input;
      effects.push({ type: 'xstate.spawnChild', params: { id: invoke.id, src: invoke.src, input } });
    }
    if (!state.final) return { status: 'active', value: state.key, context };
    if (rootOutput === undefined) return { status: 'done', value: state.key, context, output: undefined };
    const finalOutput = state.node.output !== undefined ? outputOf(state.node.output, context, event) : undefined;
    const doneStateEvent = { type: `xstate.done.state.${state.node.id}`, output: finalOutput };
    return { status: 'done', value: state.key, context, output: outputOf(rootOutput, context, doneStateEvent) };
  };

  const microstep = (from: FlatState, transition: FlatTransition, context: unknown, event: StepEvent, effects: StepEffect[]): StepSnapshot => {
    if (transition.target) for (const invoke of from.invokes) effects.push({ type: 'xstate.stopChild', params: { id: invoke.id } });
    let next = context;
    for (const update of transition.updates) next = update(next, event);
    return transition.target ? enter(transition.target, next, event, effects) : { status: 'active', value: from.key, context: next };
  };

  const settle = (snapshot: StepSnapshot, event: StepEvent, effects: StepEffect[]): StepSnapshot => {
    let current = snapshot;
    let iterations = 0;
    while (current.status === 'active') {
      const state = byKey.get(current.value as string)!;
      const context = current.context;
      const enabled = state.always.find((transition) => transition.guard === null || transition.guard(context, event));
      if (!enabled) break;
      iterations += 1;
      if (iterations > maxIterations) throw new Error(`Infinite loop detected: the machine has processed more than ${maxIterations} microsteps without reaching a stable state.`);
      current = microstep(state, enabled, context, event, effects);
    }
    // A final state has no invokes (refused above) and its source's were stopped on the way in.
    return current;
  };

  const initial = (input: unknown): ComputedStep => {
    const event: StepEvent = { type: 'xstate.init', input };
    const effects: StepEffect[] = [];
    const context = typeof contextConfig === 'function'
      ? Object.assign({}, contextConfig({ spawn, input, self: host.self }))
      : (contextConfig ?? {});
    return [settle(enter(initialState, context, event, effects), event, effects), effects];
  };

  const next = (snapshot: StepSnapshot, event: StepEvent): ComputedStep => {
    const effects: StepEffect[] = [];
    const state = byKey.get(snapshot.value as string);
    if (snapshot.status !== 'active' || !state) return [snapshot, effects];
    const context = snapshot.context;
    const candidates = state.on.get(event.type) ?? [];
    let enabled: FlatTransition | undefined;
    for (const candidate of candidates) {
      let passed: boolean;
      try {
        passed = candidate.guard === null || candidate.guard(context, event);
      } catch (error) {
        const label = candidate.guardName === undefined ? '' : `'${candidate.guardName}' `;
        throw new Error(`Unable to evaluate guard ${label}in transition for event '${event.type}' in state node '${state.node.id}':\n${(error as Error).message}`);
      }
      if (passed) {
        enabled = candidate;
        break;
      }
    }
    if (!enabled) {
      if (!event.type.startsWith('xstate.error.actor')) return [settle(snapshot, event, effects), effects];
      for (const invoke of state.invokes) effects.push({ type: 'xstate.stopChild', params: { id: invoke.id } });
      return [{ status: 'error', value: snapshot.value, context, error: event.error }, effects];
    }
    return [settle(microstep(state, enabled, context, event, effects), event, effects), effects];
  };

  return { flat: true, transitions: { initial, next } };
}
