import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listRunEvents } from '../../../src/runs/run-event-repository.js';
import { listRunOutputs, runOutputContext } from '../../../src/runs/run-output-repository.js';
import { runToEnd, TEST_TOOLS_MODULE } from '../../support/run-helpers.js';
import { startTestKeel, type TestKeel } from '../../support/test-keel.js';

// Fallback providers tighten the answer ceiling and scrub what was stored; audit rows hold exactly
// what the run's audit level allows.

const EMAIL = 'alice@example.com';
const SECRET = `sk-${'a1B2c3D4e5'.repeat(4)}`;
const SENSITIVE = `mail ${EMAIL} the key ${SECRET}`;

let keel: TestKeel;

beforeAll(async () => {
  const emitsThenFails = [{ artifact: { name: 'notes', text: `notes: ${SENSITIVE}` }, toolCalls: [{ name: 'lookup', arguments: {} }] }, { fail: 'server_error' }];
  const answers = [{ reply: 'unused' }, { reply: `final: ${SENSITIVE}` }];
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_RUNS_PROVIDER_BACKOFF_MS: '5',
      KEEL_RUNS_PROVIDER_ATTEMPTS: '1',
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        primary: { type: 'scripted', steps: emitsThenFails },
        'fallback-redacted': { type: 'scripted', steps: answers, privacy: { answerLevel: 'redacted' } },
        'fallback-metadata': { type: 'scripted', steps: answers, privacy: { answerLevel: 'metadata', auditLevel: 'metadata' } },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'to-redacted', name: 'R', provider: 'primary', fallbacks: ['fallback-redacted'], tools: ['lookup'] },
        { id: 'to-metadata', name: 'M', provider: 'primary', fallbacks: ['fallback-metadata'], tools: ['lookup'] },
        { id: 'audit-full', name: 'AF', provider: 'echo' },
        { id: 'audit-redacted', name: 'AR', provider: 'echo', privacy: { auditLevel: 'redacted' } },
        { id: 'audit-metadata', name: 'AM', provider: 'echo', privacy: { auditLevel: 'metadata' } },
        { id: 'audit-none', name: 'AN', provider: 'echo', privacy: { auditLevel: 'none' } },
      ],
    },
  });
});
afterAll(async () => keel?.dispose());

async function rawOutputs(runId: string) {
  return keel.context.pool.any(sql.type(z.object({ ordinal: z.number(), level: z.string(), content: z.instanceof(Buffer) }))`
    SELECT ordinal, level, content FROM run_outputs WHERE run_id = ${runId} ORDER BY ordinal`);
}

describe('fallback and the answer ceiling', () => {
  it('from a full provider to a redacted one scrubs the stored artifact and keeps the answer redacted', async () => {
    const run = await runToEnd(keel, 'to-redacted', 'start');
    expect(run).toMatchObject({ status: 'completed', answer_level: 'redacted', provider: 'fallback-redacted' });
    const outputs = await listRunOutputs(keel.context.pool, keel.context.sealer, run.id);
    expect(outputs.map((output) => [output.kind, output.level])).toEqual([
      ['artifact', 'redacted'],
      ['answer', 'redacted'],
    ]);
    const text = JSON.stringify(outputs);
    expect(text).not.toContain(EMAIL);
    expect(text).not.toContain(SECRET);
    expect(text).toContain('notes: mail *** the key ***');
    expect(text).toContain('final: mail *** the key ***');
    const selected = (await listRunEvents(keel.context.pool, run.id)).find((event) => event.kind === 'provider_selected');
    expect(selected?.payload).toMatchObject({ provider: 'fallback-redacted', answerLevel: 'redacted', tightened: true });
  });

  it('to a metadata provider leaves no content at all', async () => {
    const run = await runToEnd(keel, 'to-metadata', 'start');
    expect(run).toMatchObject({ status: 'completed', answer_level: 'metadata', audit_level: 'metadata' });
    const outputs = await listRunOutputs(keel.context.pool, keel.context.sealer, run.id);
    expect(outputs.map((output) => output.level)).toEqual(['metadata', 'metadata']);
    const text = JSON.stringify(outputs);
    for (const fragment of [EMAIL, SECRET, 'notes', 'final', 'mail']) expect(text).not.toContain(fragment);
    // The rows really were rewritten: the sealed bytes open to the summary, nothing else.
    for (const row of await rawOutputs(run.id)) {
      const opened = keel.context.sealer.openJson(runOutputContext(run.id, row.ordinal), row.content);
      expect(opened.ok && JSON.stringify(opened.value)).not.toContain('alice');
    }
    // Audit events written after the fallback are at the tightened audit level too.
    const events = await listRunEvents(keel.context.pool, run.id);
    const afterFallback = events.slice(events.findIndex((event) => event.kind === 'provider_selected'));
    expect(JSON.stringify(afterFallback)).not.toContain('alice');
  });
});

describe('audit levels', () => {
  const input = `please contact ${EMAIL} with ${SECRET}`;

  it('full keeps the content as it was', async () => {
    const run = await runToEnd(keel, 'audit-full', input);
    expect(run.audit_level).toBe('full');
    const reply = (await listRunEvents(keel.context.pool, run.id)).find((event) => event.kind === 'model_reply')!;
    expect(reply.payload).toMatchObject({ provider: 'echo', content: { text: `echo: ${input}`, toolCalls: [] } });
  });

  it('redacted masks secrets and emails', async () => {
    const run = await runToEnd(keel, 'audit-redacted', input);
    const events = await listRunEvents(keel.context.pool, run.id);
    const reply = events.find((event) => event.kind === 'model_reply')!;
    expect(reply.payload).toMatchObject({ content: { text: 'echo: please contact *** with ***' } });
    expect(JSON.stringify(events)).not.toContain(EMAIL);
    expect(JSON.stringify(events)).not.toContain(SECRET);
  });

  it('metadata keeps counts, lengths, kinds and names, no content', async () => {
    const run = await runToEnd(keel, 'audit-metadata', input);
    const events = await listRunEvents(keel.context.pool, run.id);
    const reply = events.find((event) => event.kind === 'model_reply')!;
    expect(reply.payload).toMatchObject({ provider: 'echo', inputTokens: expect.any(Number), content: { kind: 'object' } });
    const text = JSON.stringify(events);
    for (const fragment of [EMAIL, SECRET, 'please', 'contact', 'echo:']) expect(text).not.toContain(fragment);
    expect(text).toContain(`"length":${`echo: ${input}`.length}`);
  });

  it('none stores nothing', async () => {
    const run = await runToEnd(keel, 'audit-none', input);
    expect(run.status).toBe('completed');
    expect(await listRunEvents(keel.context.pool, run.id)).toEqual([]);
  });
});
