import { StreamResponse } from '@a2a-js/sdk';
import { A2AService } from '@a2a-js/sdk/server/grpc';
import { status as GrpcStatus } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { A2AErrors, invalidParams, type A2AError } from '../../../src/a2a/a2a-error.js';
import { EVENT_ID_KEY, grpcMethods, streamFrame } from '../../../src/a2a/grpc-binding.js';
import { grpcErrorStatus, grpcStatusOf, STATUS_DETAILS_KEY } from '../../../src/a2a/grpc-status.js';
import { BAD_REQUEST_TYPE, decodeStatusDetails, ERROR_INFO_TYPE } from '../../support/grpc-client.js';

// The gRPC binding's tables: a handler for every method of lf.a2a.v1.A2AService, the gRPC status
// of every A2A error (specification 5.4) with its google.rpc.Status in grpc-status-details-bin, as
// the official SDK decodes it, and the journal id each stream update carries.

describe('grpcMethods', () => {
  it('serves every method of the service definition, each with its own handler', () => {
    expect(Object.keys(grpcMethods).sort()).toEqual(Object.keys(A2AService).sort());
    for (const [name, method] of Object.entries(grpcMethods)) {
      expect(method.handle.name).toBe(`handle${name[0]!.toUpperCase()}${name.slice(1)}`);
      expect(method.kind).toBe(A2AService[name as keyof typeof A2AService].responseStream ? 'stream' : 'unary');
    }
  });
});

describe('A2A errors as gRPC statuses', () => {
  it.each([
    ['taskNotFound', GrpcStatus.NOT_FOUND],
    ['taskNotCancelable', GrpcStatus.FAILED_PRECONDITION],
    ['pushNotSupported', GrpcStatus.UNIMPLEMENTED],
    ['unsupportedOperation', GrpcStatus.UNIMPLEMENTED],
    ['resultNotRetainable', GrpcStatus.UNIMPLEMENTED],
    ['contentTypeNotSupported', GrpcStatus.INVALID_ARGUMENT],
    ['invalidAgentResponse', GrpcStatus.INTERNAL],
    ['extendedCardNotConfigured', GrpcStatus.FAILED_PRECONDITION],
    ['extensionSupportRequired', GrpcStatus.FAILED_PRECONDITION],
    ['versionNotSupported', GrpcStatus.UNIMPLEMENTED],
    ['invalidParams', GrpcStatus.INVALID_ARGUMENT],
    ['parse', GrpcStatus.INVALID_ARGUMENT],
    ['unauthenticated', GrpcStatus.UNAUTHENTICATED],
    ['internal', GrpcStatus.INTERNAL],
    ['methodNotFound', GrpcStatus.NOT_FOUND],
  ] as const)('%s is gRPC status %i', (name, code) => {
    expect(grpcStatusOf(A2AErrors[name]('refused'))).toBe(code);
  });

  it('puts a google.rpc.Status with the ErrorInfo in grpc-status-details-bin, decodable by the official SDK', () => {
    const error = A2AErrors.taskNotFound('task t-1 not found', { metadata: { taskId: 't-1', 'ünïcode': 'välue' } });
    const status = grpcErrorStatus(error);
    expect({ code: status.code, details: status.details }).toEqual({ code: GrpcStatus.NOT_FOUND, details: 'task t-1 not found' });
    const decoded = decodeStatusDetails(GrpcStatus.NOT_FOUND, status.metadata!.get(STATUS_DETAILS_KEY)[0] as Buffer);
    expect(decoded).toMatchObject({
      message: 'task t-1 not found',
      reason: 'TASK_NOT_FOUND',
      domain: 'a2a-protocol.org',
      errorMetadata: { taskId: 't-1', 'ünïcode': 'välue' },
      detailTypes: [ERROR_INFO_TYPE],
    });
  });

  it('adds a google.rpc.BadRequest with the field violations of invalid params', () => {
    const error: A2AError = invalidParams([
      { path: ['message', 'parts'], message: 'Required' },
      { path: ['configuration', 'historyLength'], message: 'Number must be greater than or equal to 0' },
    ]);
    const status = grpcErrorStatus(error);
    const decoded = decodeStatusDetails(GrpcStatus.INVALID_ARGUMENT, status.metadata!.get(STATUS_DETAILS_KEY)[0] as Buffer);
    expect(decoded.detailTypes).toEqual([ERROR_INFO_TYPE, BAD_REQUEST_TYPE]);
    expect(decoded.fieldViolations).toEqual([
      { field: 'message.parts', description: 'Required' },
      { field: 'configuration.historyLength', description: 'Number must be greater than or equal to 0' },
    ]);
  });
});

describe('streamFrame', () => {
  const status = { state: 'TASK_STATE_WORKING' as const, timestamp: '2025-01-01T00:00:00.000Z' };

  it('stamps the journal sequence into each update and keeps the metadata it had', () => {
    const statusFrame = StreamResponse.toJSON(streamFrame({ id: 7, response: { statusUpdate: { taskId: 't', contextId: 'c', status, metadata: { mine: 'kept' } } } }) as StreamResponse);
    expect(statusFrame).toEqual({ statusUpdate: { taskId: 't', contextId: 'c', status, metadata: { mine: 'kept', [EVENT_ID_KEY]: 7 } } });
    const artifact = { artifactId: 'a', parts: [{ text: 'x' }] };
    const artifactFrame = StreamResponse.toJSON(streamFrame({ id: 8, response: { artifactUpdate: { taskId: 't', contextId: 'c', artifact, append: true } } }) as StreamResponse);
    expect(artifactFrame).toEqual({ artifactUpdate: { taskId: 't', contextId: 'c', artifact, append: true, metadata: { [EVENT_ID_KEY]: 8 } } });
  });

  it('leaves the task snapshot and a direct message as they are', () => {
    const task = { id: 't', contextId: 'c', status };
    expect(StreamResponse.toJSON(streamFrame({ id: 3, response: { task } }) as StreamResponse)).toEqual({ task });
    const message = { messageId: 'm', role: 'ROLE_AGENT' as const, parts: [{ text: 'hi' }], contextId: 'c' };
    expect(StreamResponse.toJSON(streamFrame({ id: 4, response: { message } }) as StreamResponse)).toEqual({ message });
  });
});
