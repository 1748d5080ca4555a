import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createActor, fromPromise, toPromise, type AnyActorLogic, type InputFrom, type OutputFrom } from 'xstate';
import { parse } from 'yaml';
import { AMOUNT_PROMPT, amountOf, machine, REFUND_LIMIT } from '../../../examples/refund-agent/refund.machine.js';
import { issueRefund, readLedger } from '../../../examples/refund-agent/tools.js';
import { createLogger } from '../../../src/log/logger.js';
import { checkStatechart, loadStatechart } from '../../../src/statecharts/statechart-definition.js';
import { runStatechart, type StatechartHost, type StepOutcome } from '../../../src/statecharts/statechart-run.js';
import { askApproval, askInput, callModel, callTool, KEEL_STEP, stepMarkerOf, type StatechartOutput } from '../../../src/statecharts/steps.js';
import type { ToolContext } from '../../../src/tools/tool.js';
import { tempDir } from '../../support/test-keel.js';

// The refund agent of examples/refund-agent: the machine is one Keel can run durably, and with
// stand-ins for Keel's steps it takes the approval path above the limit and the direct one below.

const EXAMPLE = join(import.meta.dirname, '..', '..', '..', 'examples', 'refund-agent');

/** A stand-in for a Keel step, typed as the step it replaces (machine.provide wants that type). */
function stub<TStep extends AnyActorLogic>(step: TStep, run: (input: InputFrom<TStep>) => Promise<OutputFrom<TStep>>): TStep {
  return Object.assign(
    fromPromise<OutputFrom<TStep>, InputFrom<TStep>>(({ input }) => run(input)),
    { [KEEL_STEP]: stepMarkerOf(step) },
  ) as unknown as TStep;
}

type Scripted = { model: unknown; answers?: unknown[]; approve?: boolean; toolFails?: string };

/** Runs the machine in memory with scripted steps; returns what each step was asked and the states it passed. */
async function refund(script: Scripted) {
  const asked = { model: 0, input: [] as string[], approval: [] as unknown[], tool: [] as unknown[] };
  const answers = [...(script.answers ?? [])];
  const actor = createActor(
    machine.provide({
      actors: {
        callModel: stub(callModel, async () => {
          asked.model += 1;
          return { text: JSON.stringify(script.model), data: script.model };
        }),
        askInput: stub(askInput, async (input) => {
          asked.input.push(input.prompt);
          return answers.shift();
        }),
        askApproval: stub(askApproval, async (input) => {
          asked.approval.push(input);
          return { approved: script.approve ?? true };
        }),
        callTool: stub(callTool, async (input) => {
          asked.tool.push(input);
          if (script.toolFails) throw new Error(script.toolFails);
          const args = input.arguments as { amount: number; reason: string };
          return { refundId: 'rf_test', amount: args.amount, reason: args.reason, issuedAt: '2026-01-01T00:00:00.000Z' };
        }),
      },
    }),
  );
  const states: string[] = [];
  actor.subscribe((snapshot) => states.push(String(snapshot.value)));
  const done = toPromise(actor);
  actor.start();
  const output = (await done) as Exclude<StatechartOutput, string>;
  return { output, asked, states: states.filter((state, index) => state !== states[index - 1]) };
}

describe('the refund example machine', () => {
  it('passes checkStatechart: only Keel steps, only carried-out actions, string meta.status', async () => {
    const checked = checkStatechart(machine, 'examples/refund-agent');
    expect(checked.ok ? [...checked.steps.keys()].sort() : checked.problems).toEqual(['askApproval', 'askInput', 'callModel', 'callTool']);
    // And loads as the example's config names it.
    const config = parse(readFileSync(join(EXAMPLE, 'keel.config.yaml'), 'utf8')) as { agents: { machine: string; tools: string[] }[]; toolModules: string[] };
    const loaded = await loadStatechart(config.agents[0]!.machine, EXAMPLE, 'agents.0 (refunds)');
    expect(loaded.ok).toBe(true);
    expect(config.agents[0]!.tools).toEqual([issueRefund.name]);
  });

  it(`above ${REFUND_LIMIT}: asks for approval, then refunds`, async () => {
    const { output, asked, states } = await refund({ model: { amount: 120, reason: 'arrived broken' } });
    expect(states).toEqual(['classifying', 'awaitingApproval', 'refunding', 'refunded']);
    expect(asked.approval).toEqual([
      { summary: `Refund 120.00 (above the limit of ${REFUND_LIMIT}): arrived broken`, details: { amount: 120, reason: 'arrived broken', limit: REFUND_LIMIT } },
    ]);
    expect(asked.tool).toEqual([{ tool: 'issue_refund', arguments: { amount: 120, reason: 'arrived broken' } }]);
    expect(output).toEqual({
      text: 'Refunded 120.00 (arrived broken); refund rf_test.',
      data: { status: 'refunded', refundId: 'rf_test', amount: 120, reason: 'arrived broken', issuedAt: '2026-01-01T00:00:00.000Z' },
    });
  });

  it(`at or below ${REFUND_LIMIT}: refunds at once, no approval`, async () => {
    for (const amount of [40, REFUND_LIMIT]) {
      const { output, asked, states } = await refund({ model: { amount, reason: 'late delivery' } });
      expect(states).toEqual(['classifying', 'refunding', 'refunded']);
      expect(asked.approval).toEqual([]);
      expect(asked.input).toEqual([]);
      expect(asked.tool).toEqual([{ tool: 'issue_refund', arguments: { amount, reason: 'late delivery' } }]);
      expect(output.data).toMatchObject({ status: 'refunded', amount });
    }
  });

  it('without an amount: asks the client (again, until the answer has one), then goes on by the amount', async () => {
    const { output, asked, states } = await refund({ model: { amount: null, reason: 'wrong size' }, answers: ['no idea', { amount: 150 }] });
    expect(asked.input).toEqual([AMOUNT_PROMPT, AMOUNT_PROMPT]);
    expect(states).toEqual(['classifying', 'askingAmount', 'awaitingApproval', 'refunding', 'refunded']);
    expect(output.data).toMatchObject({ status: 'refunded', amount: 150, reason: 'wrong size' });

    const small = await refund({ model: { reason: 'wrong size' }, answers: ['it was $35.50'] });
    expect(small.states).toEqual(['classifying', 'askingAmount', 'refunding', 'refunded']);
    expect(small.output.data).toMatchObject({ amount: 35.5 });
  });

  it('a denied approval refunds nothing and says so', async () => {
    const { output, asked, states } = await refund({ model: { amount: 500, reason: 'changed my mind' }, approve: false });
    expect(states).toEqual(['classifying', 'awaitingApproval', 'declined']);
    expect(asked.tool).toEqual([]);
    expect(output).toEqual({
      text: 'No refund was issued: an operator declined the refund.',
      data: { status: 'declined', amount: 500, reason: 'changed my mind', why: 'an operator declined the refund' },
    });
  });

  it('a failing refund tool ends declined with its message', async () => {
    const { output, states } = await refund({ model: { amount: 10, reason: 'scratched' }, toolFails: 'payment provider unavailable' });
    expect(states).toEqual(['classifying', 'refunding', 'declined']);
    expect(output.text).toBe('No refund was issued: the refund could not be issued (payment provider unavailable).');
  });

  it('reads amounts from numbers, texts and objects', () => {
    expect([120, '120', '$99.90', 'about 12,5 euros', '$1,200', '1,250.75', { amount: 7 }, { amount: '8' }, 0, -3, 'none', null, {}].map(amountOf)).toEqual([
      120, 120, 99.9, 12.5, 1200, 1250.75, 7, 8, null, null, null, null, null,
    ]);
  });
});

describe('the example under Keel runner', () => {
  it('shows each state\'s status, waits for the input, and emits the receipt as an artifact', async () => {
    const loaded = await loadStatechart('./refund.machine.ts', EXAMPLE, 'refunds');
    if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
    const shown: { statuses: string[]; artifacts: unknown[] }[] = [];
    const performed: string[] = [];
    const host: StatechartHost = {
      perform: async (step): Promise<StepOutcome> => {
        performed.push(step.src);
        switch (step.src) {
          case 'callModel':
            return { kind: 'done', output: { text: '{"amount":null,"reason":"broken"}', data: { amount: null, reason: 'broken' } } };
          case 'askInput':
            return { kind: 'wait', status: 'waiting_for_input', pending: step.input };
          case 'callTool':
            return { kind: 'done', output: { refundId: 'rf_1', amount: 60, reason: 'broken', issuedAt: '2026-01-01T00:00:00.000Z' } };
          default:
            throw new Error(`unexpected step ${step.src}`);
        }
      },
      commit: async ({ shown: seen }) => {
        shown.push(seen);
        return true;
      },
      checkpoint: async () => ({ alive: true }),
    };
    const first = await runStatechart(loaded.definition, { record: null, input: { text: 'my blender arrived broken' }, answer: null }, host);
    expect(first).toMatchObject({ kind: 'wait', status: 'waiting_for_input', pending: { prompt: AMOUNT_PROMPT } });
    if (first.kind !== 'wait') throw new Error('expected a wait');

    const second = await runStatechart(loaded.definition, { record: first.record, input: null, answer: { stepId: first.step.id, output: '60' } }, host);
    expect(second).toMatchObject({ kind: 'complete', output: { text: 'Refunded 60.00 (broken); refund rf_1.', data: { status: 'refunded', refundId: 'rf_1' } } });
    expect(performed).toEqual(['callModel', 'askInput', 'callTool']);
    expect(shown.flatMap((entry) => entry.statuses)).toEqual(['Reading the refund request', 'Waiting for the order amount', 'Issuing the refund']);
    expect(shown.flatMap((entry) => entry.artifacts)).toEqual([
      { name: 'receipt', parts: [{ data: { refundId: 'rf_1', amount: 60, reason: 'broken', issuedAt: '2026-01-01T00:00:00.000Z' } }], append: false, lastChunk: true },
    ]);
  });
});

describe('the issue_refund tool', () => {
  let dir: string;
  beforeEach(() => {
    dir = tempDir('keel-refund-ledger-');
    process.env.REFUND_LEDGER = join(dir, 'ledger.jsonl');
  });
  afterEach(() => {
    delete process.env.REFUND_LEDGER;
    rmSync(dir, { recursive: true, force: true });
  });

  const context = (runId: string, toolCallId: string): ToolContext => ({
    runId,
    agentId: 'refunds',
    toolCallId,
    fetch: (() => Promise.reject(new Error('no network'))) as unknown as ToolContext['fetch'],
    signal: new AbortController().signal,
    logger: createLogger({ level: 'silent' }),
  });

  it('is an idempotent write: the same call again returns the refund already issued', async () => {
    expect(issueRefund.effect).toBe('idempotent_write');
    const first = await issueRefund.run({ amount: 120, reason: 'broken' }, context('run-1', '2-refunding'));
    const again = await issueRefund.run({ amount: 120, reason: 'broken' }, context('run-1', '2-refunding'));
    const other = await issueRefund.run({ amount: 120, reason: 'broken' }, context('run-2', '2-refunding'));
    expect(first.kind).toBe('ok');
    expect(again).toEqual(first);
    expect(other).not.toEqual(first);
    expect((await readLedger()).map((entry) => entry.idempotencyKey)).toEqual(['run-1:2-refunding', 'run-2:2-refunding']);
  });

  it('refuses bad arguments as a tool error', async () => {
    expect(await issueRefund.run({ amount: -1, reason: 'x' }, context('run-1', 'a'))).toEqual({ kind: 'error', message: 'amount must be a positive number' });
    expect(await issueRefund.run({ amount: 5 }, context('run-1', 'b'))).toEqual({ kind: 'error', message: 'reason must be a non-empty string' });
    expect(await readLedger()).toEqual([]);
  });
});
