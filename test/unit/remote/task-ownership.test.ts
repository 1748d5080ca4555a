import { GetTaskRequest, Task } from '@a2a-js/sdk';
import { describe, expect, it } from 'vitest';
import { namedTaskId } from '../../../src/remote/reconcile.js';
import { createdByMessage, type SdkTask } from '../../../src/remote/remote-task.js';

// Which remote task a pending dependency may adopt: a callback body only names a candidate; the
// task GetTask answers is ours only when its history holds the user message we sent.

/** A task as the SDK client hands it over (from wire JSON, so enums are proto numbers). */
const remoteTask = (json: Record<string, unknown>) => Task.fromJSON({ id: 't-1', contextId: 'c-1', status: { state: 'TASK_STATE_WORKING' }, ...json }) as unknown as SdkTask;
const sent = (messageId: string, role = 'ROLE_USER') => ({ messageId, role, parts: [{ text: 'please handle it' }] });

describe('createdByMessage', () => {
  it('is true for the task asked for whose history holds our user message', () => {
    expect(createdByMessage(remoteTask({ history: [sent('ours'), sent('reply', 'ROLE_AGENT')] }), 't-1', 'ours')).toBe(true);
  });

  it('is false for another client’s task, a task without history, or an answer for another id', () => {
    expect(createdByMessage(remoteTask({ history: [sent('someone-else')] }), 't-1', 'ours')).toBe(false);
    expect(createdByMessage(remoteTask({}), 't-1', 'ours')).toBe(false);
    expect(createdByMessage(remoteTask({ history: [sent('ours')] }), 't-2', 'ours')).toBe(false);
  });

  it('is false when our messageId appears only on an agent message', () => {
    expect(createdByMessage(remoteTask({ history: [sent('ours', 'ROLE_AGENT')] }), 't-1', 'ours')).toBe(false);
  });
});

describe('namedTaskId', () => {
  it('reads the id a StreamResponse names, whichever member it is', () => {
    expect(namedTaskId({ task: { id: 'a' } })).toBe('a');
    expect(namedTaskId({ statusUpdate: { taskId: 'b' } })).toBe('b');
    expect(namedTaskId({ artifactUpdate: { taskId: 'c' } })).toBe('c');
    expect(namedTaskId({ message: { taskId: 'd' } })).toBe('d');
  });

  it('is null when no usable id is named', () => {
    for (const body of [null, 'x', {}, { task: {} }, { statusUpdate: { taskId: '' } }, { task: { id: 7 } }, { message: {} }]) expect(namedTaskId(body)).toBeNull();
  });
});

describe('the ownership GetTask', () => {
  it('asks for the whole history (no historyLength on the wire)', () => {
    expect(GetTaskRequest.toJSON(GetTaskRequest.fromJSON({ id: 't-1' }))).not.toHaveProperty('historyLength');
  });
});
