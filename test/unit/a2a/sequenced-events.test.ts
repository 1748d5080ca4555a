import { status as GrpcStatus } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { grpcStatusOf } from '../../../src/a2a/grpc-status.js';
import { resumePointOfParams, SEQUENCED_EVENTS_URI, stampResponse, unavailableResumePoint } from '../../../src/a2a/sequenced-events.js';
import type { StreamResponse } from '../../../src/protocol/wire.js';

// The sequenced-events extension's pure parts: the stamps (copies, other metadata kept), the
// resume point read from params, and when a resume point is refused and what the refusal names.

const K = SEQUENCED_EVENTS_URI;
const status = { state: 'TASK_STATE_WORKING' as const, timestamp: '2026-12-05T10:00:00.000Z' };

describe('stampResponse', () => {
  it('numbers each kind of event in a copy, keeping its other metadata; a Task gets the last sequence it reflects', () => {
    const update: StreamResponse = { statusUpdate: { taskId: 't', contextId: 'c', status, metadata: { mine: 1 } } };
    const frozen = JSON.stringify(update);
    expect(stampResponse(update, 7)).toEqual({ statusUpdate: { taskId: 't', contextId: 'c', status, metadata: { mine: 1, [K]: { sequence: 7 } } } });
    expect(JSON.stringify(update)).toBe(frozen);
    const artifact: StreamResponse = { artifactUpdate: { taskId: 't', contextId: 'c', artifact: { artifactId: 'a', parts: [{ text: 'x' }] } } };
    expect(stampResponse(artifact, 8)).toMatchObject({ artifactUpdate: { metadata: { [K]: { sequence: 8 } } } });
    const message: StreamResponse = { message: { messageId: 'm', role: 'ROLE_AGENT', parts: [{ text: 'hi' }] } };
    expect(stampResponse(message, 9)).toMatchObject({ message: { metadata: { [K]: { sequence: 9 } } } });
    const task: StreamResponse = { task: { id: 't', contextId: 'c', status } };
    expect(stampResponse(task, 4)).toEqual({ task: { id: 't', contextId: 'c', status, metadata: { [K]: { lastSequence: 4 } } } });
  });
});

describe('resumePointOfParams', () => {
  it('reads metadata[URI].afterSequence, none when absent, invalid params for anything but an int4 sequence', () => {
    expect(resumePointOfParams(undefined)).toEqual({ ok: true, value: undefined });
    expect(resumePointOfParams({ other: 1 })).toEqual({ ok: true, value: undefined });
    expect(resumePointOfParams({ [K]: { afterSequence: 0 } })).toEqual({ ok: true, value: 0 });
    expect(resumePointOfParams({ [K]: { afterSequence: 2_147_483_647 } })).toEqual({ ok: true, value: 2_147_483_647 });
    for (const bad of [{ afterSequence: -1 }, { afterSequence: 1.5 }, { afterSequence: '3' }, { afterSequence: 2_147_483_648 }, {}, 5, null]) {
      const read = resumePointOfParams({ [K]: bad });
      expect(read.ok).toBe(false);
      if (!read.ok) expect(read.error).toMatchObject({ code: -32602, fieldViolations: [{ field: `metadata.${K}.afterSequence` }] });
    }
  });
});

describe('unavailableResumePoint', () => {
  it('accepts every point whose next events are all there', () => {
    expect(unavailableResumePoint('t', 0, { lastSequence: 5, lastMissing: null })).toBeNull();
    expect(unavailableResumePoint('t', 5, { lastSequence: 5, lastMissing: null })).toBeNull();
    expect(unavailableResumePoint('t', 3, { lastSequence: 5, lastMissing: 3 })).toBeNull();
  });

  it('refuses a point past the journal and one before a removed event, naming the task, the point and what is available', () => {
    const beyond = unavailableResumePoint('t', 9, { lastSequence: 5, lastMissing: null });
    expect(beyond).toMatchObject({
      code: -32030,
      reason: 'RESUME_POINT_UNAVAILABLE',
      httpStatus: 400,
      status: 'OUT_OF_RANGE',
      metadata: { taskId: 't', afterSequence: '9', earliestAfterSequence: '0', lastSequence: '5' },
    });
    expect(grpcStatusOf(beyond!)).toBe(GrpcStatus.OUT_OF_RANGE);
    expect(unavailableResumePoint('t', 1, { lastSequence: 5, lastMissing: 3 })?.metadata).toEqual({ taskId: 't', afterSequence: '1', earliestAfterSequence: '3', lastSequence: '5' });
  });
});
