import { stateText } from '../statecharts/definition-graph.js';

// A run's timeline: what it did over time, built from what was committed for it (the audit trail,
// run_events; a statechart agent's path, run_machine_steps; the run row's times). Pure: the CLI
// (`keel runs timeline`) and the run page read the same segments. Only names, kinds and times are
// read: never an event's `content`, so the timeline shows nothing a metadata audit level hides.

export type WaitKind = 'input' | 'approval' | 'timer' | 'dependency';
export type SegmentKind = 'state' | 'step' | 'wait' | 'retry' | 'requeue' | 'refused';

export type TimelineSegment = {
  kind: SegmentKind;
  /** For a wait: what the run waited for. */
  wait?: WaitKind;
  label: string;
  /** Epoch milliseconds. */
  start: number;
  end: number;
  /** Not over yet: `end` is the time the timeline was built at. */
  open: boolean;
};

export type RunTimeline = {
  start: number;
  end: number;
  /** The run has not ended: open segments end at `end`, the time it was built at. */
  inProgress: boolean;
  segments: TimelineSegment[];
};

export type TimelineEvent = { sequence: number; kind: string; payload?: unknown; created_at: number };
export type TimelineMachineStep = { sequence: number; state?: unknown; event: string; at: number };
export type TimelineRun = { status: string; created_at: number; settled_at: number | null };

const WAITS: Record<string, WaitKind> = {
  waiting_for_input: 'input',
  waiting_for_approval: 'approval',
  waiting_for_timer: 'timer',
  waiting_for_dependency: 'dependency',
};

/** The statuses of a run that has ended. */
const ENDED = new Set(['completed', 'failed', 'cancelled']);
/** The audit events of a run's end: its settle, a cancel, the sweep ending an approval nobody gave. */
const END_EVENTS = new Set([...ENDED, 'approval_timed_out']);

type Meta = Record<string, unknown>;
const metaOf = (event: TimelineEvent): Meta => (event.payload !== null && typeof event.payload === 'object' ? (event.payload as Meta) : {});
const text = (value: unknown): string | null => (typeof value === 'string' && value.length > 0 ? value : null);
const count = (value: unknown): number | null => (typeof value === 'number' && Number.isFinite(value) ? value : null);
const names = (value: unknown): string[] => (Array.isArray(value) ? value.filter((item): item is string => typeof item === 'string') : []);

/** A statechart step's audit name is `step:<src>`; a loop's tool call is the tool's name. */
const stepName = (tool: unknown): string => {
  const name = text(tool) ?? 'tool';
  return name.startsWith('step:') ? `step ${name.slice(5)}` : `tool ${name}`;
};

function waitLabel(wait: WaitKind, meta: Meta): string {
  const tool = text(meta.tool);
  const pending = names(meta.pending);
  switch (wait) {
    case 'input':
      return tool ? `input for ${tool}` : 'input';
    case 'approval':
      return pending.length > 0 ? `approval of ${pending.join(', ')}` : 'approval';
    case 'dependency':
      return tool ? `dependency of ${tool}` : 'dependency';
    case 'timer':
      return 'timer';
  }
}

/**
 * The segments of a run's timeline, in the order they started:
 *   - state    queued until the first claim; a statechart agent's states (each from the transition
 *              that entered it to the next); for another agent, each stretch a worker held it;
 *   - step     a tool call or a statechart step (tool_call to its tool_result), a model call
 *              (model_reply/model_failed, which carry their duration);
 *   - wait     a suspension (input, approval, timer, dependency) until the run resumed or ended;
 *   - retry    a step performed again: a model call's later attempt, a step whose call id was
 *              performed before (after a crash or a lost lease); and the time a failed run lay
 *              failed until an operator retried it;
 *   - requeue  the time between a run's last trace and the claim that counted a requeue (its lease
 *              expired and the reaper put it back);
 *   - refused  the late writes of a worker whose claim the run no longer held, refused by the
 *              fence (decision 0088): a moment, naming the worker, its claim and what was refused.
 * A segment not over yet (the run is in it now) ends at `now` and is `open`.
 */
export function buildRunTimeline(run: TimelineRun, events: readonly TimelineEvent[], machineSteps: readonly TimelineMachineStep[], now: number): RunTimeline {
  const inProgress = !ENDED.has(run.status);
  const lastAt = Math.max(run.created_at, ...events.map((event) => event.created_at), ...machineSteps.map((step) => step.at));
  const end = inProgress ? Math.max(now, lastAt) : Math.max(run.settled_at ?? lastAt, lastAt);
  const segments: TimelineSegment[] = [];
  const add = (segment: Omit<TimelineSegment, 'open'>, open = false): TimelineSegment => {
    const added = { ...segment, start: segment.start, end: Math.max(segment.start, segment.end), open };
    segments.push(added);
    return added;
  };
  /** A statechart step's segment and the id of the invocation that ran it (its call id's `<n>-<invoke id>`). */
  const invocations = new Map<TimelineSegment, string>();

  const ordered = [...events].sort((a, b) => a.sequence - b.sequence);
  const firstClaim = ordered.find((event) => event.kind === 'claimed' || event.kind === 'resumed');
  // Queued until a worker first took it (or, with no trail kept, until its machine's first transition).
  const firstTaken = firstClaim?.created_at ?? (machineSteps.length > 0 ? Math.min(...machineSteps.map((step) => step.at)) : null);
  if (firstTaken !== null) add({ kind: 'state', label: 'queued', start: run.created_at, end: firstTaken });
  else add({ kind: 'state', label: inProgress ? 'queued' : run.status, start: run.created_at, end }, inProgress);

  // A statechart agent's states, from its committed path.
  const path = [...machineSteps].sort((a, b) => a.sequence - b.sequence);
  const visits = path.map((step, index) => {
    const next = path[index + 1];
    const last = next === undefined;
    const segment = add({ kind: 'state', label: stateText(step.state), start: step.at, end: last ? end : next.at }, last && inProgress);
    return { segment, at: step.at, enteredBy: step.event.startsWith(DONE_ACTOR) ? step.event.slice(DONE_ACTOR.length) : null };
  });

  let held: { start: number } | null = null;
  let wait: { kind: WaitKind; label: string; start: number } | null = null;
  let requeues = 0;
  let endedAt: number | null = null;
  let previousAt = run.created_at;
  const calls = new Map<string, { label: string; start: number; retry: boolean }>();
  const performed = new Set<string>();

  const release = (at: number) => {
    if (held && path.length === 0) add({ kind: 'state', label: 'running', start: held.start, end: at });
    held = null;
  };
  const endWait = (at: number) => {
    if (wait) add({ kind: 'wait', wait: wait.kind, label: wait.label, start: wait.start, end: at });
    wait = null;
  };
  /** Steps whose result never came end where the worker's hold on the run ended. */
  const abandonCalls = (at: number) => {
    for (const call of calls.values()) add({ kind: call.retry ? 'retry' : 'step', label: `${call.label} (no result)`, start: call.start, end: at });
    calls.clear();
  };

  for (const event of ordered) {
    const meta = metaOf(event);
    const at = event.created_at;
    switch (event.kind) {
      case 'claimed':
      case 'resumed': {
        const seen = count(meta.requeues) ?? requeues;
        if (seen > requeues) {
          add({ kind: 'requeue', label: `requeue ${seen} (lease expired)`, start: previousAt, end: at });
          requeues = seen;
        }
        abandonCalls(previousAt);
        release(previousAt);
        endWait(at);
        held = { start: at };
        break;
      }
      case 'suspended': {
        abandonCalls(at);
        release(at);
        const kind = WAITS[text(meta.status) ?? ''];
        if (kind) wait = { kind, label: waitLabel(kind, meta), start: at };
        break;
      }
      case 'tool_call': {
        const callId = text(meta.callId) ?? `#${event.sequence}`;
        const retry = performed.has(callId);
        performed.add(callId);
        calls.set(callId, { label: retry ? `retry ${stepName(meta.tool)}` : stepName(meta.tool), start: at, retry });
        break;
      }
      case 'tool_result': {
        const callId = text(meta.callId) ?? '';
        const call = calls.get(callId);
        const outcome = text(meta.outcome);
        const suffix = outcome === null || outcome === 'ok' ? '' : ` (${outcome}${text(meta.errorClass) ? ` ${text(meta.errorClass)}` : ''})`;
        const label = `${call?.label ?? stepName(meta.tool)}${suffix}`;
        const start = call?.start ?? at - (count(meta.durationMs) ?? 0);
        const segment = add({ kind: call?.retry ? 'retry' : 'step', label, start, end: at });
        const invocation = STEP_CALL_ID.exec(callId)?.[1];
        if (invocation !== undefined) invocations.set(segment, invocation);
        calls.delete(callId);
        break;
      }
      case 'model_reply':
      case 'model_failed': {
        const attempt = count(meta.attempt) ?? 1;
        const provider = text(meta.provider) ?? 'provider';
        const failed = event.kind === 'model_failed' ? ` failed (${text(meta.class) ?? 'error'})` : '';
        const label = attempt > 1 ? `retry model ${provider}, attempt ${attempt}${failed}` : `model ${provider}${failed}`;
        add({ kind: attempt > 1 ? 'retry' : 'step', label, start: at - (count(meta.durationMs) ?? 0), end: at });
        break;
      }
      case 'operator_retried': {
        // The time the run lay failed, until an operator retried it from a state it had committed.
        add({ kind: 'retry', label: `retried by ${text(meta.operator) ?? 'an operator'} from state ${text(meta.state) ?? '?'}`, start: endedAt ?? at, end: at });
        endedAt = null;
        break;
      }
      case 'late_write_refused': {
        const refused = metaOf({ ...event, payload: meta.refused });
        const what = Object.entries(refused)
          .map(([write, n]) => (write === 'audit_rows' ? `${count(n) ?? 0} audit rows` : write.replaceAll('_', ' ')))
          .join(', ');
        add({ kind: 'refused', label: `late write from worker ${text(meta.worker) ?? '?'} with claim ${text(meta.claim) ?? '?'} refused${what ? `: ${what}` : ''}`, start: at, end: at });
        break;
      }
      default:
        if (END_EVENTS.has(event.kind)) {
          abandonCalls(at);
          release(at);
          endWait(at);
          endedAt = at;
        }
    }
    previousAt = at;
  }
  // What is still going on: open until now when the run has not ended, else closed at its end.
  for (const call of calls.values()) add({ kind: call.retry ? 'retry' : 'step', label: call.label, start: call.start, end }, inProgress);
  if (wait !== null) add({ kind: 'wait', wait: wait.kind, label: wait.label, start: wait.start, end }, inProgress);
  if (held !== null && path.length === 0) add({ kind: 'state', label: 'running', start: held.start, end }, inProgress);

  // Times are milliseconds, and a quick step and the transition its end caused can share one: the
  // committed order breaks such ties. A segment sorts under the state visit it happened in (the
  // last one entered by its start), except a step whose completion entered that visit (its
  // `xstate.done.actor.<invoke id>` names the step's invocation): it happened in the visit before.
  // Read only for tied segments, once each (the sort compares a segment many times).
  const visitOfSegment = new Map(visits.map((visit, index) => [visit.segment, index]));
  const visitOf = (segment: TimelineSegment): number => {
    let index = visitOfSegment.get(segment);
    if (index !== undefined) return index;
    index = -1;
    if (segment.kind !== 'state') {
      visits.forEach((visit, at) => {
        if (visit.at <= segment.start) index = at;
      });
      const invocation = invocations.get(segment);
      if (index >= 0 && invocation !== undefined && visits[index]!.enteredBy === invocation) index -= 1;
    }
    visitOfSegment.set(segment, index);
    return index;
  };
  segments.sort((a, b) => a.start - b.start || visitOf(a) - visitOf(b) || KIND_ORDER.indexOf(a.kind) - KIND_ORDER.indexOf(b.kind));
  return { start: run.created_at, end, inProgress, segments };
}

const KIND_ORDER: readonly SegmentKind[] = ['state', 'wait', 'step', 'retry', 'requeue', 'refused'];
/** The event of a transition an invoked actor's completion took (XState's `xstate.done.actor.<invoke id>`). */
const DONE_ACTOR = 'xstate.done.actor.';
/** A statechart step's call id, `<step number>-<invoke id>` (workers/statechart-agent-run.ts). */
const STEP_CALL_ID = /^\d+-(.+)$/;

/** A duration for a person: 850ms, 4.2s, 3m 05s, 2h 10m. */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  // Tenths cut, not rounded: 59.96s is not shown as a minute.
  if (ms < 60_000) return `${(Math.floor(ms / 100) / 10).toFixed(1)}s`;
  const minutes = Math.floor(ms / 60_000);
  if (minutes < 60) return `${minutes}m ${String(Math.floor((ms % 60_000) / 1000)).padStart(2, '0')}s`;
  return `${Math.floor(minutes / 60)}h ${String(minutes % 60).padStart(2, '0')}m`;
}

/** The kind a segment is shown as: `wait(input)` for a wait. */
export const segmentKindText = (segment: TimelineSegment): string => (segment.kind === 'wait' ? `wait(${segment.wait})` : segment.kind);

/** One line per segment: its offset from the run's creation, its duration, its kind and label. */
export function timelineLines(timeline: RunTimeline): string[] {
  const lines = [`${timeline.inProgress ? 'in progress' : 'ended'}, ${formatDuration(timeline.end - timeline.start)} from creation to ${timeline.inProgress ? 'now' : 'its end'}`];
  if (timeline.segments.length === 0) lines.push('  (nothing recorded)');
  for (const segment of timeline.segments) {
    const offset = `+${formatDuration(segment.start - timeline.start)}`.padStart(10);
    const duration = `${formatDuration(segment.end - segment.start)}${segment.open ? '+' : ''}`.padStart(9);
    lines.push(`${offset} ${duration}  ${segmentKindText(segment).padEnd(16)} ${segment.label}${segment.open ? ' (now)' : ''}`);
  }
  return lines;
}
