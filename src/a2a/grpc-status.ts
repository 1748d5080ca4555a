import { BinaryWriter } from '@bufbuild/protobuf/wire';
import { Metadata, status as GrpcStatus, type StatusObject } from '@grpc/grpc-js';
import { ERROR_DOMAIN, type A2AError } from './a2a-error.js';

// A2A errors as gRPC statuses (specification 10.6): the status code of the specification's table
// (5.4) and a `google.rpc.Status` in the `grpc-status-details-bin` trailer whose details hold the
// `google.rpc.ErrorInfo` (reason, domain, metadata) and, for field errors, a `google.rpc.BadRequest`
// with its field violations, for a per-client limit a `google.rpc.RetryInfo` (and the delay as
// `retry-after` metadata). The binary messages are written by hand with protobuf's wire writer:
// four small, frozen messages of googleapis, not worth a generated module.

export const STATUS_DETAILS_KEY = 'grpc-status-details-bin';
const ERROR_INFO_TYPE = 'type.googleapis.com/google.rpc.ErrorInfo';
const BAD_REQUEST_TYPE = 'type.googleapis.com/google.rpc.BadRequest';
const RETRY_INFO_TYPE = 'type.googleapis.com/google.rpc.RetryInfo';
/** A refusal's retry delay in whole seconds, as plain trailing metadata beside the RetryInfo detail (as HTTP's Retry-After). */
export const RETRY_AFTER_KEY = 'retry-after';

/**
 * The gRPC status of each A2A error code, as the specification's table (5.4) of v1.0.0 gives it.
 * It differs from the REST body's `status` name (a2a-error.ts) where the table says UNIMPLEMENTED:
 * that name pairs with the HTTP status, 400, which AIP-193 calls FAILED_PRECONDITION.
 */
const A2A_CODES: Readonly<Record<number, GrpcStatus>> = {
  [-32001]: GrpcStatus.NOT_FOUND,
  [-32002]: GrpcStatus.FAILED_PRECONDITION,
  [-32003]: GrpcStatus.UNIMPLEMENTED,
  [-32004]: GrpcStatus.UNIMPLEMENTED,
  [-32005]: GrpcStatus.INVALID_ARGUMENT,
  [-32006]: GrpcStatus.INTERNAL,
  [-32007]: GrpcStatus.FAILED_PRECONDITION,
  [-32008]: GrpcStatus.FAILED_PRECONDITION,
  [-32009]: GrpcStatus.UNIMPLEMENTED,
};

/** The gRPC status code of an A2A error: the table's for A2A errors, else the google.rpc.Code named by `status`. */
export function grpcStatusOf(error: A2AError): GrpcStatus {
  const byCode = A2A_CODES[error.code];
  if (byCode !== undefined) return byCode;
  const byName = (GrpcStatus as unknown as Record<string, number>)[error.status];
  return typeof byName === 'number' ? (byName as GrpcStatus) : GrpcStatus.UNKNOWN;
}

const any = (typeUrl: string, value: Uint8Array) => ({ typeUrl, value });

function errorInfo(error: A2AError): Uint8Array {
  const writer = new BinaryWriter();
  writer.uint32(10).string(error.reason);
  writer.uint32(18).string(ERROR_DOMAIN);
  for (const [key, value] of Object.entries(error.metadata ?? {})) {
    writer.uint32(26).fork().uint32(10).string(key).uint32(18).string(value).join();
  }
  return writer.finish();
}

function badRequest(violations: NonNullable<A2AError['fieldViolations']>): Uint8Array {
  const writer = new BinaryWriter();
  for (const violation of violations) {
    writer.uint32(10).fork().uint32(10).string(violation.field).uint32(18).string(violation.description).join();
  }
  return writer.finish();
}

/** google.rpc.RetryInfo: retry_delay (1), a google.protobuf.Duration of whole seconds (1). */
function retryInfo(seconds: number): Uint8Array {
  const writer = new BinaryWriter();
  writer.uint32(10).fork().uint32(8).int64(seconds).join();
  return writer.finish();
}

/** The `google.rpc.Status` of an A2A error, encoded for the `grpc-status-details-bin` trailer. */
export function encodeStatusDetails(error: A2AError, code: GrpcStatus = grpcStatusOf(error)): Buffer {
  const details = [any(ERROR_INFO_TYPE, errorInfo(error))];
  if (error.fieldViolations?.length) details.push(any(BAD_REQUEST_TYPE, badRequest(error.fieldViolations)));
  if (error.retryAfterSeconds !== undefined) details.push(any(RETRY_INFO_TYPE, retryInfo(error.retryAfterSeconds)));
  const writer = new BinaryWriter();
  writer.uint32(8).int32(code);
  writer.uint32(18).string(error.message);
  for (const detail of details) writer.uint32(26).fork().uint32(10).string(detail.typeUrl).uint32(18).bytes(detail.value).join();
  return Buffer.from(writer.finish());
}

/** The status a call ends with for an A2A error: code, message, and the details in the trailers. */
export function grpcErrorStatus(error: A2AError): Partial<StatusObject> {
  const code = grpcStatusOf(error);
  const metadata = new Metadata();
  metadata.set(STATUS_DETAILS_KEY, encodeStatusDetails(error, code));
  if (error.retryAfterSeconds !== undefined) metadata.set(RETRY_AFTER_KEY, String(error.retryAfterSeconds));
  return { code, details: error.message, metadata };
}
