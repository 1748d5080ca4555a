// A2A errors as values. Handlers return them; the bindings render them: JSON-RPC `error` with an
// ErrorInfo in `data`, or a REST `{error: {code, status, message, details}}` with its HTTP status.

export const ERROR_DOMAIN = 'a2a-protocol.org';

export type FieldViolation = { field: string; description: string };

export type A2AError = {
  code: number;
  reason: string;
  message: string;
  httpStatus: number;
  /** google.rpc.Code name for REST bodies. */
  status: string;
  metadata?: Record<string, string>;
  fieldViolations?: FieldViolation[];
  /** How long to wait before retrying, in whole seconds: the Retry-After header, a RetryInfo detail, gRPC's `retry-after`. */
  retryAfterSeconds?: number;
};

const make = (code: number, reason: string, httpStatus: number, status: string) => (message: string, extra: Partial<A2AError> = {}): A2AError => ({
  code,
  reason,
  message,
  httpStatus,
  status,
  ...extra,
});

// httpStatus is the HTTP+JSON status of specification 5.4's table (docs/conformance.md).
export const A2AErrors = {
  parse: make(-32700, 'PARSE_ERROR', 400, 'INVALID_ARGUMENT'),
  invalidRequest: make(-32600, 'INVALID_REQUEST', 400, 'INVALID_ARGUMENT'),
  methodNotFound: make(-32601, 'METHOD_NOT_FOUND', 404, 'NOT_FOUND'),
  invalidParams: make(-32602, 'INVALID_ARGUMENT', 400, 'INVALID_ARGUMENT'),
  internal: make(-32603, 'INTERNAL', 500, 'INTERNAL'),
  taskNotFound: make(-32001, 'TASK_NOT_FOUND', 404, 'NOT_FOUND'),
  taskNotCancelable: make(-32002, 'TASK_NOT_CANCELABLE', 409, 'FAILED_PRECONDITION'),
  pushNotSupported: make(-32003, 'PUSH_NOTIFICATION_NOT_SUPPORTED', 400, 'FAILED_PRECONDITION'),
  unsupportedOperation: make(-32004, 'UNSUPPORTED_OPERATION', 400, 'FAILED_PRECONDITION'),
  resultNotRetainable: make(-32004, 'RESULT_NOT_RETAINABLE', 400, 'FAILED_PRECONDITION'),
  contentTypeNotSupported: make(-32005, 'CONTENT_TYPE_NOT_SUPPORTED', 415, 'INVALID_ARGUMENT'),
  invalidAgentResponse: make(-32006, 'INVALID_AGENT_RESPONSE', 502, 'INTERNAL'),
  extendedCardNotConfigured: make(-32007, 'EXTENDED_AGENT_CARD_NOT_CONFIGURED', 400, 'FAILED_PRECONDITION'),
  extensionSupportRequired: make(-32008, 'EXTENSION_SUPPORT_REQUIRED', 400, 'FAILED_PRECONDITION'),
  versionNotSupported: make(-32009, 'VERSION_NOT_SUPPORTED', 400, 'FAILED_PRECONDITION'),
  unauthenticated: make(-32600, 'UNAUTHENTICATED', 401, 'UNAUTHENTICATED'),
  payloadTooLarge: make(-32600, 'PAYLOAD_TOO_LARGE', 413, 'INVALID_ARGUMENT'),
  /** A per-client limit (src/limits/; docs/decisions/0060): Keel's own code in the server range, 429, RESOURCE_EXHAUSTED. */
  clientLimitExceeded: make(-32029, 'CLIENT_LIMIT_EXCEEDED', 429, 'RESOURCE_EXHAUSTED'),
  /** A message over a2a.maxMessageBytes (the params are readable, one of them too large). */
  messageTooLarge: make(-32602, 'MESSAGE_TOO_LARGE', 413, 'INVALID_ARGUMENT'),
  /** A message key (messageId or Idempotency-Key) sent again with another request: invalid params, 422 over HTTP+JSON (decision 0064). */
  messageKeyReused: make(-32602, 'MESSAGE_KEY_REUSED', 422, 'INVALID_ARGUMENT'),
  /**
   * The sequenced-events extension's resume point that no longer exists (docs/extensions/sequenced-events.md,
   * decision 0069): Keel's own code in the server range, OUT_OF_RANGE (HTTP 400 as google.rpc maps it).
   */
  resumePointUnavailable: make(-32030, 'RESUME_POINT_UNAVAILABLE', 400, 'OUT_OF_RANGE'),
} as const;

export const taskNotFound = (id: string) => A2AErrors.taskNotFound(`task ${id} not found`, { metadata: { taskId: id } });

export type Result<T> = { ok: true; value: T } | { ok: false; error: A2AError };
export const ok = <T>(value: T): Result<T> => ({ ok: true, value });
export const fail = <T = never>(error: A2AError): Result<T> => ({ ok: false, error });

function details(error: A2AError): Array<Record<string, unknown>> {
  const list: Array<Record<string, unknown>> = [
    {
      '@type': 'type.googleapis.com/google.rpc.ErrorInfo',
      reason: error.reason,
      domain: ERROR_DOMAIN,
      ...(error.metadata ? { metadata: error.metadata } : {}),
    },
  ];
  if (error.fieldViolations?.length) {
    list.push({ '@type': 'type.googleapis.com/google.rpc.BadRequest', fieldViolations: error.fieldViolations });
  }
  if (error.retryAfterSeconds !== undefined) {
    list.push({ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: `${error.retryAfterSeconds}s` });
  }
  return list;
}

export function jsonRpcError(error: A2AError): { code: number; message: string; data: Array<Record<string, unknown>> } {
  return { code: error.code, message: error.message, data: details(error) };
}

export function restError(error: A2AError): { error: { code: number; status: string; message: string; details: Array<Record<string, unknown>> } } {
  return { error: { code: error.httpStatus, status: error.status, message: error.message, details: details(error) } };
}

/** Turns zod issues into an invalid-params error with one field violation per issue. */
export function invalidParams(issues: ReadonlyArray<{ path: ReadonlyArray<string | number>; message: string }>, prefix = ''): A2AError {
  const fieldViolations = issues.slice(0, 20).map((issue) => ({
    field: [prefix, ...issue.path.map(String)].filter(Boolean).join('.') || '(params)',
    description: issue.message,
  }));
  return A2AErrors.invalidParams(`invalid params: ${fieldViolations.map((violation) => `${violation.field}: ${violation.description}`).join('; ')}`, { fieldViolations });
}
