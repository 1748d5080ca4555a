import { describe, expect, it } from 'vitest';
import { A2AErrors, restError } from '../../../src/a2a/a2a-error.js';

// The HTTP+JSON status of each A2A error, as the specification's error table (5.4) maps it.

describe('A2AErrors', () => {
  it.each([
    ['taskNotFound', -32001, 'TASK_NOT_FOUND', 404],
    ['taskNotCancelable', -32002, 'TASK_NOT_CANCELABLE', 409],
    ['pushNotSupported', -32003, 'PUSH_NOTIFICATION_NOT_SUPPORTED', 400],
    ['unsupportedOperation', -32004, 'UNSUPPORTED_OPERATION', 400],
    ['contentTypeNotSupported', -32005, 'CONTENT_TYPE_NOT_SUPPORTED', 415],
    ['invalidAgentResponse', -32006, 'INVALID_AGENT_RESPONSE', 502],
    ['extendedCardNotConfigured', -32007, 'EXTENDED_AGENT_CARD_NOT_CONFIGURED', 400],
    ['extensionSupportRequired', -32008, 'EXTENSION_SUPPORT_REQUIRED', 400],
    ['versionNotSupported', -32009, 'VERSION_NOT_SUPPORTED', 400],
  ] as const)('%s is %i with reason %s and HTTP status %i', (name, code, reason, httpStatus) => {
    const error = A2AErrors[name]('refused');
    expect({ code: error.code, reason: error.reason, httpStatus: error.httpStatus }).toEqual({ code, reason, httpStatus });
    expect(restError(error).error.code).toBe(httpStatus);
  });
});
