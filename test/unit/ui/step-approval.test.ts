import { describe, expect, it } from 'vitest';
import type { PendingApproval } from '../../../machines/agent-loop.machine.js';
import { pendingApprovalDetails } from '../../../src/ui/pages.js';
import { stepApprovalOf } from '../../../src/ui/step-approval.js';

// An approval a statechart step asks for (askApproval) reads as one: the state and the step that
// wait, and what the step asks at the audit levels that keep content; never "the model asked to
// call this tool", which is what a model's tool calls read as.

const KEY = 'run-1:approval:0';
const pending: PendingApproval = { kind: 'tools', calls: [{ id: KEY, name: 'askApproval', arguments: { summary: 'refund 250 to ann@example.com' } }], digest: 'd1' };
const waiting = { id: 'approval', src: 'askApproval', key: KEY, input: { summary: 'refund 250 to ann@example.com', details: { amount: 250, customer: 'ann@example.com' } } };
const STATE = { review: 'approval' };

describe('a statechart step waiting for approval', () => {
  it('names the state and the step, and shows what it asks at full', () => {
    const step = stepApprovalOf(pending, waiting, STATE, 'full')!;
    expect(step).toEqual({
      state: 'review.approval',
      step: 'approval',
      src: 'askApproval',
      level: 'full',
      input: { summary: 'refund 250 to ann@example.com', details: { amount: 250, customer: 'ann@example.com' } },
      fields: [],
    });
    const text = pendingApprovalDetails(pending, step).text;
    expect(text).toContain('The step <strong class="mono" data-step>approval</strong> <span class="muted">(askApproval)</span>');
    expect(text).toContain(`in state <strong class="mono" data-state>review.approval</strong> is waiting for an operator's decision.`);
    expect(text).toContain('It asks: <q data-summary>refund 250 to ann@example.com</q>');
    expect(text).toContain('&quot;amount&quot;: 250');
    expect(text).not.toContain('model');
    expect(text).not.toContain('tool');
  });

  it('redacts what it asks at redacted, and shows only the fields\' names at metadata and nothing at none', () => {
    const redacted = stepApprovalOf(pending, waiting, STATE, 'redacted')!;
    expect(redacted.input!.summary).not.toContain('ann@example.com');
    expect(JSON.stringify(redacted.input!.details)).not.toContain('ann@example.com');
    expect(pendingApprovalDetails(pending, redacted).text).toContain(`(redacted, as this run's audit level keeps it)`);

    const metadata = stepApprovalOf(pending, waiting, STATE, 'metadata')!;
    expect(metadata).toMatchObject({ state: 'review.approval', step: 'approval', input: null, fields: ['amount', 'customer'] });
    const text = pendingApprovalDetails(pending, metadata).text;
    expect(text).toContain('data-step>approval<');
    expect(text).toContain('this run keeps no content at its audit level (<code>metadata</code>); its details have the fields amount, customer.');
    expect(text).toContain(`Runs keep it with <code>privacy.level</code> set to <code>redacted</code> or <code>full</code>`);
    expect(text).not.toContain('250');
    expect(text).not.toContain('ann@');

    expect(stepApprovalOf(pending, waiting, STATE, 'none')).toMatchObject({ input: null, fields: [] });
  });

  it('names a step invoked without an id of its own by its name in setup({ actors })', () => {
    const generated = { ...waiting, id: '0.refund.review.approval', src: 'approve' };
    expect(stepApprovalOf(pending, generated, STATE, 'full')).toMatchObject({ step: 'approve', src: 'approve' });
    expect(pendingApprovalDetails(pending, stepApprovalOf(pending, generated, STATE, 'full')).text).toContain('data-step>approve</strong>\nin state');
  });

  it('leaves other approvals as they were: a model\'s tool calls, a tool that needs approval, a guardrail', () => {
    const toolCall: PendingApproval = { kind: 'tools', calls: [{ id: KEY, name: 'refund_tool', arguments: { amount: 1 } }], digest: 'd2' };
    expect(stepApprovalOf(toolCall, waiting, STATE, 'full')).toBeNull();
    expect(stepApprovalOf(pending, null, STATE, 'full')).toBeNull();
    expect(stepApprovalOf(pending, { ...waiting, key: 'another' }, STATE, 'full')).toBeNull();
    expect(pendingApprovalDetails(toolCall).text).toContain('The model asked to call this tool');
    const guardrail: PendingApproval = { kind: 'guardrail', stage: 'input', guardrail: 'pii', reason: 'an address', answer: null, digest: 'd3' };
    expect(stepApprovalOf(guardrail, waiting, STATE, 'full')).toBeNull();
  });
});
