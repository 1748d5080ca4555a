import { BinaryReader } from '@bufbuild/protobuf/wire';
import { decodeErrorInfo, decodeStatus, GRPC_STATUS_DETAILS_BIN } from '@a2a-js/sdk/errors/grpc';
import { A2AService } from '@a2a-js/sdk/server/grpc';
import { credentials, makeGenericClientConstructor, Metadata, type ChannelOptions, type Client, type ServiceError } from '@grpc/grpc-js';
import { expect } from 'vitest';

// gRPC on the wire, for what the official client does not show or will not send: response
// metadata, any A2A-Version, raw bytes. The client is grpc-js with the SDK's generated service
// definition, so requests are the proto messages the official client sends.

export const ERROR_INFO_TYPE = 'type.googleapis.com/google.rpc.ErrorInfo';
export const BAD_REQUEST_TYPE = 'type.googleapis.com/google.rpc.BadRequest';

const A2AClient = makeGenericClientConstructor(A2AService, 'lf.a2a.v1.A2AService');

export function rawGrpcClient(address: string, options: ChannelOptions = {}): Client {
  return new A2AClient(address, credentials.createInsecure(), options);
}

/** Metadata from plain pairs (a value of null leaves the key out). */
export function grpcMetadata(values: Record<string, string | null>): Metadata {
  const metadata = new Metadata();
  for (const [key, value] of Object.entries(values)) if (value !== null) metadata.set(key, value);
  return metadata;
}

export type UnaryOutcome = { response: unknown; error: ServiceError | null; headers: Metadata };

/** One unary call by its definition key (`sendMessage`, ...), with the initial metadata the server sent. */
export function rawUnary(client: Client, method: keyof typeof A2AService, request: unknown, metadata: Metadata): Promise<UnaryOutcome> {
  return new Promise((resolve) => {
    let headers = new Metadata();
    const definition = A2AService[method] as unknown as { path: string; requestSerialize: (value: unknown) => Buffer; responseDeserialize: (value: Buffer) => unknown };
    const call = client.makeUnaryRequest(definition.path, definition.requestSerialize, definition.responseDeserialize, request, metadata, (error, response) =>
      resolve({ response, error: error ?? null, headers }),
    );
    call.on('metadata', (received: Metadata) => (headers = received));
  });
}

/** A unary call whose request is sent as the given bytes, whatever they are. */
export function rawBytesUnary(client: Client, method: keyof typeof A2AService, bytes: Buffer, metadata: Metadata): Promise<ServiceError | null> {
  const definition = A2AService[method] as unknown as { path: string };
  return new Promise((resolve) => {
    client.makeUnaryRequest(definition.path, (value: Buffer) => value, (value: Buffer) => value, bytes, metadata, (error) => resolve(error ?? null));
  });
}

export type DecodedGrpcError = {
  code: number;
  message: string;
  reason: string | undefined;
  domain: string | undefined;
  errorMetadata: Record<string, string>;
  detailTypes: string[];
  fieldViolations: Array<{ field: string; description: string }>;
};

function decodeFieldViolations(value: Uint8Array): Array<{ field: string; description: string }> {
  const reader = new BinaryReader(value);
  const out: Array<{ field: string; description: string }> = [];
  while (reader.pos < reader.len) {
    const tag = reader.uint32();
    if (tag >>> 3 !== 1) {
      reader.skip(tag & 7);
      continue;
    }
    const inner = new BinaryReader(reader.bytes());
    const violation = { field: '', description: '' };
    while (inner.pos < inner.len) {
      const innerTag = inner.uint32();
      if (innerTag >>> 3 === 1) violation.field = inner.string();
      else if (innerTag >>> 3 === 2) violation.description = inner.string();
      else inner.skip(innerTag & 7);
    }
    out.push(violation);
  }
  return out;
}

/** A `google.rpc.Status` from the `grpc-status-details-bin` trailer, read with the SDK's decoders. */
export function decodeStatusDetails(code: number, details: Buffer | undefined): DecodedGrpcError {
  expect(details, 'grpc-status-details-bin trailer').toBeDefined();
  const status = decodeStatus(details!);
  expect(status.code).toBe(code);
  const info = status.details.find((detail) => detail.typeUrl === ERROR_INFO_TYPE);
  const decoded = info ? decodeErrorInfo(info.value) : undefined;
  const badRequest = status.details.find((detail) => detail.typeUrl === BAD_REQUEST_TYPE);
  return {
    code,
    message: status.message,
    reason: decoded?.reason,
    domain: decoded?.domain,
    errorMetadata: decoded?.metadata ?? {},
    detailTypes: status.details.map((detail) => detail.typeUrl),
    fieldViolations: badRequest ? decodeFieldViolations(badRequest.value) : [],
  };
}

/** The status of a raw call's error, its details decoded. */
export function decodeServiceError(error: ServiceError | null): DecodedGrpcError {
  expect(error, 'a gRPC error').not.toBeNull();
  const bin = error!.metadata.get(GRPC_STATUS_DETAILS_BIN)[0];
  return decodeStatusDetails(error!.code, bin === undefined ? undefined : Buffer.isBuffer(bin) ? bin : Buffer.from(bin, 'binary'));
}

/** What the official client threw for a gRPC error (its status and the raw status details), decoded. */
export function decodeSdkError(error: unknown): DecodedGrpcError {
  const grpcError = error as { transport?: string; status?: number; statusDetailsBin?: Buffer };
  expect(grpcError.transport, `a gRPC error from the SDK, got ${String(error)}`).toBe('grpc');
  return decodeStatusDetails(grpcError.status!, grpcError.statusDetailsBin);
}

/** The error a promise (or a stream, read to its end) of the official client rejects with. */
export async function sdkFailure(action: Promise<unknown> | AsyncGenerator<unknown>): Promise<DecodedGrpcError> {
  try {
    if (Symbol.asyncIterator in action) {
      for await (const _event of action as AsyncGenerator<unknown>) void _event;
    } else {
      await action;
    }
  } catch (error) {
    return decodeSdkError(error);
  }
  throw new Error('expected the call to fail');
}
