import {
  createActor,
  fromTransition,
  type AnyActorScope,
  type AnyMachineSnapshot,
  type AnyStateMachine,
  type AnyStateNode,
  type ContextFrom,
  type InputFrom,
  type OutputFrom,
  type StateMachine,
  type StateValue,
} from 'xstate';
import { compileFlatTransitions, type ComputedStep, type MachineTransitions, type StepEffect, type StepSnapshot } from './flat-transitions.js';

// Runs a machine whose work is done by promise invokes without creating an actor for it: the
// machine is stepped through its own pure transition function, and each invoke the new state
// starts is carried out by a step function the caller supplies. Per run this costs the
// macrosteps and nothing else: no actor, no actor system, no mailbox, no subscription (see
// docs/decisions/0023-pure-transitions-for-the-agent-loop.md).
//
// XState's exported `initialTransition` / `transition` are the same computation but build a
// throwaway actor of the machine (and with it an actor system and the machine's initial state)
// on every call, which costs more than the actor path it would replace. The stepper calls the
// functions they wrap, `machine.getInitialSnapshot(scope, input)` and
// `machine.transition(snapshot, event, scope)` (the machine's ActorLogic interface), with one
// inert scope built once per stepper. A flat machine (the agent loop) is cheaper still: its
// transitions are read once from its state nodes and computed without a snapshot object, a child
// actor or an action list per microstep (flat-transitions.ts, decision 0032); `engine` says which
// computation a stepper uses.
//
// What a machine may use, checked when the stepper is created (a machine that needs more is
// refused then, not halfway through a run):
//   - assign and raise without a delay: they are resolved inside the transition itself;
//   - invokes of actors named in setup({ actors }): the step function of that name runs with the
//     invoke's input, and its result comes back as `xstate.done.actor.<id>` (output) or
//     `xstate.error.actor.<id>` (error), exactly the events a promise actor sends its parent;
//   - guards, eventless transitions, parallel and nested states, history, final states and output.
// Refused: custom actions (functions with effects), sendTo, sendParent, emit, log, cancel,
// enqueueActions, spawnChild / stopChild as actions, delayed raise and `after` (there is no
// clock), invokes with inline logic, a systemId or onSnapshot. The machine gets no events from
// outside: a state at rest with no step running is an error, as it could never move on.

/** The actors a machine's setup() names, with their logic. */
type ProvidedActorsOf<TMachine> =
  TMachine extends StateMachine<any, any, any, infer TActor, any, any, any, any, any, any, any, any, any, any, any> ? TActor : never; // eslint-disable-line @typescript-eslint/no-explicit-any

/**
 * What a step is told besides its input. `signal` is aborted when the machine leaves the invoking
 * state (or the run ends) before the step has finished; its result is then dropped, as a stopped
 * actor's would be. It is made on first use: most steps never look at it, and an AbortController
 * per step was a visible share of a run's cost.
 */
export type StepControl = { readonly signal: AbortSignal };

/**
 * One step function per actor the machine's setup() names: it does what the invoked actor would
 * do. Its result is the invoke's output; a rejection (or a throw) is the invoke's error.
 */
export type MachineSteps<TMachine extends AnyStateMachine> = {
  [TActor in ProvidedActorsOf<TMachine> as TActor['src']]: (
    input: InputFrom<TActor['logic']>,
    control: StepControl,
  ) => Promise<OutputFrom<TActor['logic']>>;
};

class LazyAbort implements StepControl {
  private controller: AbortController | null = null;
  private aborted = false;

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort();
    }
    return this.controller.signal;
  }

  abort(): void {
    this.aborted = true;
    this.controller?.abort();
  }
}

export type SteppedRun<TMachine extends AnyStateMachine> = {
  output: OutputFrom<TMachine>;
  context: ContextFrom<TMachine>;
  value: StateValue;
};

/** What a run shows of each snapshot it passes through. */
export type SteppedSnapshot<TMachine extends AnyStateMachine> = {
  status: 'active' | 'done';
  value: StateValue;
  context: ContextFrom<TMachine>;
};

export type StepOptions<TMachine extends AnyStateMachine> = {
  /**
   * Sees every snapshot the run passes through, as an actor's subscribers would: the initial one,
   * then one per step outcome; an error snapshot rejects the run instead.
   */
  onSnapshot?: (snapshot: SteppedSnapshot<TMachine>) => void;
};

/**
 * How the stepper computes transitions: `flat` from the machine's state nodes read once (a flat
 * machine only), `xstate` with the machine's own `transition`.
 */
export type StepEngine = 'flat' | 'xstate';

export type MachineStepper<TMachine extends AnyStateMachine> = {
  /**
   * Runs the machine from `input` until it reaches a final state and returns its output and
   * final context. Rejects with the machine's error when a step's error is not handled (as
   * `toPromise(actor)` does), or when the machine rests with nothing left to wait for.
   */
  run: (input: InputFrom<TMachine>, steps: MachineSteps<TMachine>, options?: StepOptions<TMachine>) => Promise<SteppedRun<TMachine>>;
  /** The step functions every run must supply: the names of the actors the machine invokes. */
  readonly invokedSources: readonly string[];
  /** Which computation of the machine's transitions the stepper uses (decision 0032). */
  readonly engine: StepEngine;
};

/** What `transition` reports besides the snapshot: the effects the stepper has to carry out. */
export type ExecutableAction = { type: string; params: unknown };
type SpawnParams = { id: string; src: unknown; input: unknown };
type Effect = ExecutableAction | StepEffect;

type Settlement = { id: string; ok: true; output: unknown } | { id: string; ok: false; error: unknown };
type Running = { settled: Promise<Settlement>; abort: LazyAbort };

const ALLOWED_BUILT_INS = new Set(['xstate.assign', 'xstate.raise']);

/**
 * A scope to compute a machine's transitions in without running it: its `self` is an actor that is
 * never started, of a logic that does nothing (an invoke's child is created with it as parent, and
 * never started either; a machine's input or assign functions see it as `self`), and the
 * executable actions of each transition go to `collect` instead of being carried out.
 */
export function inertScope(collect: (action: ExecutableAction) => void): AnyActorScope {
  const host = createActor(fromTransition((state: null) => state, null));
  return {
    self: host,
    id: host.id,
    sessionId: host.sessionId,
    system: host.system,
    logger: () => undefined,
    defer: () => undefined,
    emit: () => undefined,
    stopChild: () => undefined,
    actionExecutor: (action) => collect(action),
  };
}

/** The machine's own transition function, computed in an inert scope that collects the effects. */
function xstateTransitions(machine: AnyStateMachine, scope: AnyActorScope, collect: (into: ExecutableAction[]) => void): MachineTransitions {
  // Transitions are synchronous, so concurrent runs never share a collection.
  function computed(compute: () => AnyMachineSnapshot): ComputedStep {
    const actions: ExecutableAction[] = [];
    collect(actions);
    const snapshot = compute();
    collect([]);
    return [snapshot as StepSnapshot, actions as StepEffect[]];
  }
  return {
    initial: (input) => computed(() => machine.getInitialSnapshot(scope, input)),
    next: (snapshot, event) => computed(() => machine.transition(snapshot as AnyMachineSnapshot, event, scope)),
  };
}

export function createMachineStepper<TMachine extends AnyStateMachine>(
  machine: TMachine,
  { engine: requested }: { engine?: StepEngine } = {},
): MachineStepper<TMachine> {
  const invokedSources = checkSteppable(machine);

  // The scope every transition of every run is computed in (the flat engine uses only its `self`).
  let collected: ExecutableAction[] = [];
  const scope = inertScope((action) => collected.push(action));
  const flat = requested === 'xstate' ? null : compileFlatTransitions(machine, { self: scope.self, system: scope.system });
  if (requested === 'flat' && flat && !flat.flat) throw new Error(`machine ${machine.id} is not flat:\n  ${flat.reasons.join('\n  ')}`);
  const engine: StepEngine = flat?.flat ? 'flat' : 'xstate';
  const transitions = flat?.flat ? flat.transitions : xstateTransitions(machine, scope, (into) => (collected = into));

  async function run(input: InputFrom<TMachine>, steps: MachineSteps<TMachine>, options: StepOptions<TMachine> = {}): Promise<SteppedRun<TMachine>> {
    const stepOf = steps as Record<string, ((input: unknown, control: StepControl) => Promise<unknown>) | undefined>;
    const missing = invokedSources.filter((src) => typeof stepOf[src] !== 'function');
    if (missing.length > 0) throw new Error(`machine ${machine.id}: no step function for ${missing.join(', ')}`);

    const running = new Map<string, Running>();
    const stopAll = () => {
      for (const entry of running.values()) entry.abort.abort();
      running.clear();
    };

    const start = ({ id, src, input: stepInput }: SpawnParams) => {
      const step = typeof src === 'string' ? stepOf[src] : undefined;
      if (!step) throw new Error(`machine ${machine.id}: a step was started for ${String(src)}, which has no step function`);
      const abort = new LazyAbort();
      // A step that throws before it returns a promise fails like one that rejects.
      const settled = new Promise<unknown>((resolve) => resolve(step(stepInput, abort))).then(
        (output): Settlement => ({ id, ok: true, output }),
        (error: unknown): Settlement => ({ id, ok: false, error }),
      );
      running.set(id, { settled, abort });
    };

    const carryOut = (actions: readonly Effect[]) => {
      for (const action of actions) {
        switch (action.type) {
          case 'xstate.spawnChild':
            start(action.params as SpawnParams);
            break;
          case 'xstate.stopChild': {
            // The invoking state was left: the step's result, if it still comes, goes nowhere.
            const child = action.params as { id: string } | undefined;
            const entry = child ? running.get(child.id) : undefined;
            if (entry) {
              entry.abort.abort();
              running.delete(child!.id);
            }
            break;
          }
          case 'xstate.raise':
            // A raise without a delay was consumed inside the transition. A delayed one was refused
            // when the stepper was made; should one come anyway, the run stops rather than drop it.
            if ((action.params as { delay?: unknown } | undefined)?.delay === undefined) break;
            throw new Error(`machine ${machine.id}: a delayed raise cannot be stepped (there is no clock)`);
          default:
            throw new Error(`machine ${machine.id}: action ${action.type} cannot be stepped: only assign, raise and invokes are carried out`);
        }
      }
    };

    let [snapshot, actions] = transitions.initial(input);
    try {
      for (;;) {
        carryOut(actions);
        if (snapshot.status === 'error') throw snapshot.error;
        options.onSnapshot?.(snapshot as SteppedSnapshot<TMachine>);
        if (snapshot.status === 'done') {
          return { output: snapshot.output as OutputFrom<TMachine>, context: snapshot.context as ContextFrom<TMachine>, value: snapshot.value };
        }
        if (running.size === 0) {
          throw new Error(`machine ${machine.id} rests in ${JSON.stringify(snapshot.value)} with no step running: it waits for an event no step can send`);
        }
        // Nothing changes `running` while the stepper waits, so the first step to settle is one of it.
        const settled = running.size === 1 ? await running.values().next().value!.settled : await Promise.race([...running.values()].map((entry) => entry.settled));
        running.delete(settled.id);
        const event = settled.ok
          ? { type: `xstate.done.actor.${settled.id}`, output: settled.output, actorId: settled.id }
          : { type: `xstate.error.actor.${settled.id}`, error: settled.error, actorId: settled.id };
        [snapshot, actions] = transitions.next(snapshot, event);
      }
    } finally {
      stopAll();
    }
  }

  return { run, invokedSources, engine };
}

/** Every state node of a machine, the root included. */
export function stateNodesOf(node: AnyStateNode): AnyStateNode[] {
  return [node, ...Object.values(node.states).flatMap((child) => stateNodesOf(child))];
}

/**
 * Refuses a machine the stepper cannot run faithfully, naming every reason at once; returns the
 * names of the actors it invokes.
 */
function checkSteppable(machine: AnyStateMachine): string[] {
  const refusals: string[] = [];
  const sources = new Set<string>();
  const actors = machine.implementations.actors as Record<string, unknown>;
  const namedActions = machine.implementations.actions as Record<string, unknown>;

  const checkAction = (action: unknown, where: string): void => {
    if (typeof action === 'string' || (typeof action === 'object' && action !== null && 'type' in action)) {
      const name = typeof action === 'string' ? action : String((action as { type: unknown }).type);
      const implementation = namedActions[name];
      if (implementation === undefined) refusals.push(`${where}: action ${name} has no implementation in setup({ actions })`);
      else checkAction(implementation, `${where} (action ${name})`);
      return;
    }
    if (typeof action !== 'function') {
      refusals.push(`${where}: an action that is neither a function nor a name`);
      return;
    }
    const builtIn = action as { type?: unknown; resolve?: unknown; delay?: unknown };
    if (!('resolve' in builtIn)) {
      refusals.push(`${where}: a custom action ${action.name || '(anonymous)'}: only assign and raise are carried out`);
      return;
    }
    const type = String(builtIn.type);
    if (!ALLOWED_BUILT_INS.has(type)) refusals.push(`${where}: ${type} is not carried out: only assign and raise are`);
    else if (type === 'xstate.raise' && builtIn.delay !== undefined) refusals.push(`${where}: a delayed raise needs a clock`);
  };

  for (const node of stateNodesOf(machine.root)) {
    const where = `state ${node.id}`;
    node.entry.forEach((action) => checkAction(action, `${where} entry`));
    node.exit.forEach((action) => checkAction(action, `${where} exit`));
    if (node.after.length > 0) refusals.push(`${where}: delayed transitions (after) need a clock`);
    const transitions = [...(node.initial ? [node.initial] : []), ...(node.always ?? []), ...[...node.transitions.values()].flat()];
    for (const transition of transitions) {
      for (const action of transition.actions) checkAction(action, `${where} on ${transition.eventType || 'entry'}`);
    }
    for (const invoke of node.invoke) {
      const src = invoke.src as unknown;
      if (typeof src !== 'string' || actors[src] === undefined || src.startsWith('xstate.invoke.')) {
        refusals.push(`${where}: an invoke of inline logic: name its actor in setup({ actors }) so a step can stand in for it`);
        continue;
      }
      if (invoke.systemId !== undefined) refusals.push(`${where}: invoke ${invoke.id} has a systemId, and a stepped run has no actor system`);
      if ((invoke as { onSnapshot?: unknown }).onSnapshot !== undefined) refusals.push(`${where}: invoke ${invoke.id} listens to snapshots, which a step does not send`);
      sources.add(src);
    }
  }
  if (refusals.length > 0) throw new Error(`machine ${machine.id} cannot be stepped:\n  ${refusals.join('\n  ')}`);
  return [...sources];
}
