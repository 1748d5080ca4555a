import { describe, expect, it } from 'vitest';
import { errorClassOf, errorTextNotKept, errorTextSetting, keptErrorText, stepErrorOf, stepFailureText } from '../../../src/statecharts/step-failure.js';
import { failureText } from '../../../src/tasks/failure-status.js';

// What a statechart run records of a step's unhandled error, level by level, and the failed
// task's text the client reads.

class CardDeclined extends Error {}
class Named extends Error {
  override name = 'PaymentError';
}

describe('a step\'s error', () => {
  it('its class: a subclass by its own name, a set name as it is, and what a non-Error is', () => {
    expect(errorClassOf(new CardDeclined('x'))).toBe('CardDeclined');
    expect(errorClassOf(new Named('x'))).toBe('PaymentError');
    expect(errorClassOf(new TypeError('x'))).toBe('TypeError');
    expect(errorClassOf(new Error('x'))).toBe('Error');
    expect(errorClassOf('x')).toBe('string');
    expect(errorClassOf(null)).toBe('null');
    expect(stepErrorOf({ message: 'declined', name: 'CardDeclined' })).toEqual({ errorClass: 'CardDeclined', message: 'declined' });
    expect(stepErrorOf({ message: 'an operator did not approve the call', reason: 'approval_denied' })).toEqual({ errorClass: 'Error', message: 'an operator did not approve the call' });
    expect(stepErrorOf(new CardDeclined('declined'))).toEqual({ errorClass: 'CardDeclined', message: 'declined' });
  });

  it('its message: as it is at full, masked at redacted, none at metadata or none', () => {
    const error = { errorClass: 'CardDeclined', message: 'declined for alice@example.com' };
    expect(keptErrorText('full', error)).toBe('declined for alice@example.com');
    expect(keptErrorText('redacted', error)).toBe('declined for ***');
    expect(keptErrorText('metadata', error)).toBeNull();
    expect(keptErrorText('none', error)).toBeNull();
    expect(stepFailureText('full', 'pay', error)).toBe('step pay failed and no transition handles its error: CardDeclined: declined for alice@example.com');
    expect(stepFailureText('metadata', 'pay', error)).toBeNull();
  });

  it('where it is not kept, the line names the setting that keeps it: the installation\'s, or the agent\'s own when that keeps none', () => {
    expect(errorTextSetting('refunds', undefined)).toBe('privacy.level');
    expect(errorTextSetting('refunds', 'full')).toBe('privacy.level');
    expect(errorTextSetting('refunds', 'metadata')).toBe('privacy.auditLevel of agent refunds');
    expect(errorTextNotKept('metadata', 'privacy.level')).toMatch(/^its message is not kept at audit level metadata: set privacy\.level to redacted or full to keep it/);
  });

  it('the failed task\'s text from the run\'s failure detail: the class, and the not-kept line where there is one', () => {
    const detail = { reason: 'machine_error', state: 'charging', step: 'pay', errorClass: 'CardDeclined', error: 'step pay failed and no transition handles its error' };
    expect(failureText('not_retryable', detail)).toBe("the agent's machine stopped: step pay failed and no transition handles its error: CardDeclined");
    const notKept = errorTextNotKept('metadata', 'privacy.level');
    expect(failureText('not_retryable', { ...detail, messageNotKept: notKept })).toBe(`the agent's machine stopped: step pay failed and no transition handles its error: CardDeclined (${notKept})`);
    // A machine at rest with nothing to move it on is no step's error.
    expect(failureText('not_retryable', { reason: 'machine_error', state: 'idle', error: 'the machine rests' })).toBe("the agent's machine stopped: the machine rests");
  });
});
