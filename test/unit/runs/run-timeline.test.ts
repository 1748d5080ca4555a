import { describe, expect, it } from 'vitest';
import { buildRunTimeline, formatDuration, timelineLines, type TimelineEvent, type TimelineMachineStep } from '../../../src/runs/run-timeline.js';
import { runTimelineChart, tickStep } from '../../../src/ui/run-timeline-chart.js';

// The timeline of a run from what was committed for it: segments with their kind, label and times,
// for the waits, retries and requeues a run goes through, and for a run still in progress.

const T0 = Date.parse('2026-12-05T10:00:00Z');
let sequence = 0;
const event = (offsetMs: number, kind: string, payload: Record<string, unknown> = {}): TimelineEvent => ({ sequence: ++sequence, kind, payload, created_at: T0 + offsetMs });
const step = (offsetMs: number, state: unknown, event = 'xstate.done.actor.x'): TimelineMachineStep => ({ sequence: ++sequence, state, event, at: T0 + offsetMs });
const brief = (segments: ReturnType<typeof buildRunTimeline>['segments']) =>
  segments.map((segment) => [segment.kind === 'wait' ? `wait(${segment.wait})` : segment.kind, segment.label, segment.start - T0, segment.end - T0, segment.open] as const);

describe('buildRunTimeline', () => {
  it('a statechart run that waited for input then completed: queued, its states, its steps and the wait', () => {
    const events = [
      event(100, 'claimed', { worker: 'w1', revision: 1, requeues: 0 }),
      event(110, 'tool_call', { tool: 'step:check', effect: 'read_only', callId: '0-0' }, ),
      event(130, 'tool_result', { tool: 'step:check', callId: '0-0', outcome: 'ok', durationMs: 20 }),
      event(150, 'suspended', { status: 'waiting_for_input', tool: 'step:ask' }),
      event(5150, 'resumed', { worker: 'w2', revision: 3, requeues: 0 }),
      event(5150, 'input_received', { tool: 'step:ask' }),
      event(5200, 'tool_call', { tool: 'step:pay', effect: 'idempotent_write', callId: '2-1' }),
      event(5300, 'tool_result', { tool: 'step:pay', callId: '2-1', outcome: 'ok', durationMs: 100 }),
      event(5320, 'completed', { reason: 'completed' }),
    ];
    const path = [step(105, 'checking', 'xstate.init'), step(140, 'asking'), step(5160, 'paying'), step(5310, 'done')];
    const timeline = buildRunTimeline({ status: 'completed', created_at: T0, settled_at: T0 + 5330 }, events, path, T0 + 99_999);
    expect(timeline).toMatchObject({ start: T0, end: T0 + 5330, inProgress: false });
    expect(brief(timeline.segments)).toEqual([
      ['state', 'queued', 0, 100, false],
      ['state', 'checking', 105, 140, false],
      ['step', 'step check', 110, 130, false],
      ['state', 'asking', 140, 5160, false],
      ['wait(input)', 'input for step:ask', 150, 5150, false],
      ['state', 'paying', 5160, 5310, false],
      ['step', 'step pay', 5200, 5300, false],
      ['state', 'done', 5310, 5330, false],
    ]);
    const lines = timelineLines(timeline);
    expect(lines[0]).toBe('ended, 5.3s from creation to its end');
    expect(lines.some((line) => /^\s+\+150ms\s+5\.0s\s+wait\(input\)\s+input for step:ask$/.test(line))).toBe(true);
  });

  it('steps and transitions in the same millisecond: a step before the state its completion entered, after the state it ran in', () => {
    // A quick step: its call, its result and the transition its end took (xstate.done.actor.<its
    // invoke id>) all stamped 120; the next state's own step starts in the millisecond that state
    // was entered (200), as does the wait the state after asks for (300).
    const events = [
      event(100, 'claimed', { worker: 'w1', revision: 1, requeues: 0 }),
      event(120, 'tool_call', { tool: 'step:check', effect: 'read_only', callId: '0-0.order.checking' }),
      event(120, 'tool_result', { tool: 'step:check', callId: '0-0.order.checking', outcome: 'ok', durationMs: 0 }),
      event(200, 'tool_call', { tool: 'step:pay', effect: 'idempotent_write', callId: '1-0.order.paying' }),
      event(200, 'tool_result', { tool: 'step:pay', callId: '1-0.order.paying', outcome: 'ok', durationMs: 0 }),
      event(300, 'suspended', { status: 'waiting_for_input', tool: 'askInput' }),
    ];
    const path = [
      step(120, 'checking', 'xstate.init'),
      step(120, 'paying', 'xstate.done.actor.0.order.checking'),
      step(200, 'asking', 'xstate.done.actor.0.order.paying'),
    ];
    const timeline = buildRunTimeline({ status: 'waiting_for_input', created_at: T0, settled_at: null }, events, path, T0 + 400);
    expect(brief(timeline.segments).map(([kind, label, start]) => [kind, label, start])).toEqual([
      ['state', 'queued', 0],
      ['state', 'checking', 120],
      ['step', 'step check', 120],
      ['state', 'paying', 120],
      ['step', 'step pay', 200],
      ['state', 'asking', 200],
      ['wait(input)', 'input for askInput', 300],
    ]);
  });

  it('an agent loop: approval and dependency waits, model retries, a tool performed again after a crash, a requeue', () => {
    const events = [
      event(50, 'claimed', { worker: 'w1', revision: 1, requeues: 0 }),
      event(300, 'model_failed', { provider: 'openai', iteration: 1, attempt: 1, class: 'rate_limited', durationMs: 200 }),
      event(900, 'model_reply', { provider: 'openai', iteration: 1, attempt: 2, durationMs: 400 }),
      event(910, 'suspended', { status: 'waiting_for_approval', pending: ['send_email'], digest: 'd'.repeat(64) }),
      event(2000, 'resumed', { worker: 'w1', revision: 3, requeues: 0 }),
      event(2000, 'approval_decided', { approved: true }),
      event(2010, 'tool_call', { tool: 'send_email', effect: 'idempotent_write', callId: 'c1' }),
      // The worker dies inside the call; the lease expires and the reaper requeues the run.
      event(9000, 'claimed', { worker: 'w2', revision: 5, requeues: 1 }),
      event(9010, 'tool_call', { tool: 'send_email', effect: 'idempotent_write', callId: 'c1' }),
      event(9050, 'tool_result', { tool: 'send_email', callId: 'c1', outcome: 'dependency', durationMs: 40 }),
      event(9060, 'suspended', { status: 'waiting_for_dependency', tool: 'remote_agent' }),
      event(12_000, 'resumed', { worker: 'w2', revision: 7, requeues: 1 }),
      event(12_500, 'failed', { reason: 'not_retryable' }),
    ];
    const timeline = buildRunTimeline({ status: 'failed', created_at: T0, settled_at: T0 + 12_500 }, events, [], T0 + 99_999);
    expect(brief(timeline.segments)).toEqual([
      ['state', 'queued', 0, 50, false],
      ['state', 'running', 50, 910, false],
      ['step', 'model openai failed (rate_limited)', 100, 300, false],
      ['retry', 'retry model openai, attempt 2', 500, 900, false],
      ['wait(approval)', 'approval of send_email', 910, 2000, false],
      ['state', 'running', 2000, 2010, false],
      ['step', 'tool send_email (no result)', 2010, 2010, false],
      ['requeue', 'requeue 1 (lease expired)', 2010, 9000, false],
      ['state', 'running', 9000, 9060, false],
      ['retry', 'retry tool send_email (dependency)', 9010, 9050, false],
      ['wait(dependency)', 'dependency of remote_agent', 9060, 12_000, false],
      ['state', 'running', 12_000, 12_500, false],
    ]);
  });

  it('a run still in progress: the state it stands in and its wait are open until now', () => {
    const events = [event(10, 'claimed', { requeues: 0 }), event(40, 'suspended', { status: 'waiting_for_timer' })];
    const timeline = buildRunTimeline({ status: 'waiting_for_timer', created_at: T0, settled_at: null }, events, [step(20, 'pausing', 'xstate.init')], T0 + 60_000);
    expect(timeline).toMatchObject({ end: T0 + 60_000, inProgress: true });
    expect(brief(timeline.segments)).toEqual([
      ['state', 'queued', 0, 10, false],
      ['state', 'pausing', 20, 60_000, true],
      ['wait(timer)', 'timer', 40, 60_000, true],
    ]);
    expect(timelineLines(timeline).at(-1)).toMatch(/^\s+\+40ms\s+59\.9s\+\s+wait\(timer\)\s+timer \(now\)$/);
    // A step in flight is open too.
    const stepping = buildRunTimeline({ status: 'running', created_at: T0, settled_at: null }, [event(10, 'claimed'), event(20, 'tool_call', { tool: 'lookup', callId: 'a' })], [], T0 + 500);
    expect(brief(stepping.segments)).toEqual([
      ['state', 'queued', 0, 10, false],
      ['state', 'running', 10, 500, true],
      ['step', 'tool lookup', 20, 500, true],
    ]);
    // A wait the run ended in: an approval nobody gave, ended by the sweep.
    const timedOut = buildRunTimeline(
      { status: 'failed', created_at: T0, settled_at: T0 + 9000 },
      [event(10, 'claimed'), event(20, 'suspended', { status: 'waiting_for_approval', pending: ['refund'] }), event(9000, 'approval_timed_out', { timeoutHours: 1 })],
      [],
      T0 + 99_999,
    );
    expect(brief(timedOut.segments).slice(-1)).toEqual([['wait(approval)', 'approval of refund', 20, 9000, false]]);
    // Not claimed yet: queued until now.
    expect(brief(buildRunTimeline({ status: 'queued', created_at: T0, settled_at: null }, [], [], T0 + 70).segments)).toEqual([['state', 'queued', 0, 70, true]]);
  });

  it('reads names and times only: content kept at the full audit level is never in a segment', () => {
    const events = [
      event(10, 'claimed', { requeues: 0 }),
      event(20, 'tool_call', { tool: 'lookup', callId: 'a', content: { arguments: { secret: 'hunter2' } } }),
      event(30, 'tool_result', { tool: 'lookup', callId: 'a', outcome: 'ok', content: { result: 'hunter2' } }),
      event(40, 'completed', { reason: 'completed' }),
    ];
    const timeline = buildRunTimeline({ status: 'completed', created_at: T0, settled_at: T0 + 40 }, events, [], T0 + 40);
    expect(JSON.stringify(timeline)).not.toContain('hunter2');
    expect(runTimelineChart(timeline).text).not.toContain('hunter2');
  });
});

describe('the timeline drawn', () => {
  it('one bar per segment to scale, open segments marked, names escaped', () => {
    const events = [event(0, 'claimed'), event(500, 'suspended', { status: 'waiting_for_input', tool: '<b>x</b>' })];
    const timeline = buildRunTimeline({ status: 'waiting_for_input', created_at: T0, settled_at: null }, events, [], T0 + 1000);
    const svg = runTimelineChart(timeline).text;
    expect(svg.match(/<g class="segment"/g)).toHaveLength(timeline.segments.length);
    expect(svg).toContain('data-kind="wait(input)" data-open="true"');
    expect(svg).toContain('&lt;b&gt;x&lt;/b&gt;');
    expect(svg).not.toContain('<b>');
    // The wait starts halfway through the run: its bar starts halfway along the axis.
    expect(svg).toMatch(/data-kind="wait\(input\)"[^]*?<rect x="620\.0"/);
  });

  it('round ticks on the time axis', () => {
    expect([1, 680, 1738, 5330, 60_000, 7_800_000].map(tickStep)).toEqual([1, 200, 500, 2000, 20_000, 2_000_000]);
    const timeline = buildRunTimeline({ status: 'completed', created_at: T0, settled_at: T0 + 1738 }, [], [], T0 + 1738);
    expect([...runTimelineChart(timeline).text.matchAll(/text-anchor="middle" fill="#6b7585">([^<]+)</g)].map((match) => match[1])).toEqual(['+0ms', '+500ms', '+1.0s', '+1.5s']);
  });

  it('durations for a person', () => {
    expect([850, 4200, 185_000, 7_800_000].map(formatDuration)).toEqual(['850ms', '4.2s', '3m 05s', '2h 10m']);
  });
});
