import { describe, expect, it } from 'vitest';
import { jsonRpcMethod, jsonRpcMethods } from '../../../src/a2a/json-rpc-binding.js';
import { operationPath, restOperations } from '../../../src/a2a/rest-binding.js';

// The bindings' dispatch tables: which handler answers which JSON-RPC method and HTTP+JSON path.

const restHandlerOf = (path: string) => restOperations.find((operation) => operation.pattern.test(path))?.handle.name;

describe('jsonRpcMethods', () => {
  it('names the eleven A2A 1.0 methods, each with its own handler', () => {
    expect(Object.keys(jsonRpcMethods).sort()).toEqual(
      [
        'CancelTask',
        'CreateTaskPushNotificationConfig',
        'DeleteTaskPushNotificationConfig',
        'GetExtendedAgentCard',
        'GetTask',
        'GetTaskPushNotificationConfig',
        'ListTaskPushNotificationConfigs',
        'ListTasks',
        'SendMessage',
        'SendStreamingMessage',
        'SubscribeToTask',
      ].sort(),
    );
    for (const [name, handler] of Object.entries(jsonRpcMethods)) expect(handler.name).toBe(`handle${name}`);
  });

  it('finds no method among the object prototype names', () => {
    for (const name of ['toString', 'constructor', '__proto__', 'hasOwnProperty']) expect(jsonRpcMethod(name)).toBeUndefined();
    expect(jsonRpcMethod('GetTask')).toBe(jsonRpcMethods.GetTask);
  });
});

describe('restOperations', () => {
  it('routes each HTTP+JSON path to its handler', () => {
    expect(restHandlerOf('/message:send')).toBe('handleSendMessage');
    expect(restHandlerOf('/message:stream')).toBe('handleSendStreamingMessage');
    expect(restHandlerOf('/tasks')).toBe('handleListTasks');
    expect(restHandlerOf('/extendedAgentCard')).toBe('handleGetExtendedAgentCard');
    expect(restHandlerOf('/tasks/t1')).toBe('handleGetTask');
    expect(restHandlerOf('/tasks/t1:cancel')).toBe('handleCancelTask');
    expect(restHandlerOf('/tasks/t1:subscribe')).toBe('handleSubscribeToTask');
    expect(restHandlerOf('/tasks/t1/pushNotificationConfigs')).toBe('handleTaskPushConfigs');
    expect(restHandlerOf('/tasks/t1/pushNotificationConfigs/c:1')).toBe('handleTaskPushConfig');
    expect(restHandlerOf('/tasks/t1:archive')).toBeUndefined();
    expect(restHandlerOf('/')).toBeUndefined();
  });

  it('reads the operation path from the raw URL, still percent-encoded and without the query', () => {
    expect(operationPath('/a2a/echo/tasks/%2541?historyLength=2')).toBe('/tasks/%2541');
    expect(operationPath('/a2a/echo/tasks/a%2Fb:cancel')).toBe('/tasks/a%2Fb:cancel');
    expect(operationPath('/a2a/echo')).toBe('/');
  });
});
