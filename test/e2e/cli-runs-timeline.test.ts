import { SendMessageRequest, Task } from '@a2a-js/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '../../src/auth/client-repository.js';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';

// `keel runs timeline <id>` on a real run of a statechart agent that asked for input, got it over
// the official client and completed: one line per segment (offset, duration, kind, label), and the
// same segments as JSON; names and times only, never the input the client sent.

const MACHINE = new URL('../fixtures/statecharts/order.machine.ts', import.meta.url).pathname;

let keel: TestKeel;
let env: NodeJS.ProcessEnv;
let runId = '';
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PRIVACY_LEVEL: 'full',
      KEEL_PROVIDERS: { echo: { type: 'echo' } },
      KEEL_AGENTS: [{ id: 'order', name: 'Order', machine: MACHINE }],
    },
  });
  env = cleanEnv(cliEnvFor(keel));
  const created = await createClient(keel.context.pool, 'timeline');
  if (!created.ok) throw new Error('client');
  const client = await sdkClient(keel.url, 'order', created.token);
  const asked = Task.toJSON((await client.sendMessage(textMessage('refund my zebra-quokka order'))) as Task) as Json;
  expect(asked.status.state).toBe('TASK_STATE_INPUT_REQUIRED');
  const reply = SendMessageRequest.fromJSON({
    message: { messageId: 'timeline-reply', role: 'ROLE_USER', taskId: asked.id, contextId: asked.contextId, parts: [{ data: { amount: 40 } }] },
  });
  const done = Task.toJSON((await client.sendMessage(reply)) as Task) as Json;
  expect(done.status.state).toBe('TASK_STATE_COMPLETED');
  runId = asked.id;
});
afterAll(async () => keel?.dispose());

describe('keel runs timeline', () => {
  it('prints one line per segment: the states, the steps and the wait for input, with offsets and durations', async () => {
    const out = await keelCli('runs', 'timeline', runId);
    expect(out.stderr).toBe('');
    expect(out.code).toBe(0);
    const lines = out.stdout.trimEnd().split('\n');
    expect(lines[0]).toBe(`run ${runId} (agent order, completed, audit level full), created ${lines[0]!.split('created ')[1]}`);
    expect(lines[1]).toMatch(/^ended, [\d.]+(ms|s) from creation to its end$/);
    const rows = lines.slice(2).map((line) => {
      const match = /^\s+\+([\dhms. ]+?)\s+([\dhms. ]+?)\s{2}(\S+)\s+(.+)$/.exec(line);
      expect(match, line).not.toBeNull();
      return [match![3], match![4]];
    });
    expect(rows).toEqual([
      ['state', 'queued'],
      ['state', 'checking'],
      ['step', 'step check'],
      ['state', 'asking'],
      ['wait(input)', 'input for askInput'],
      ['state', 'paying'],
      ['step', 'step pay'],
      ['state', 'done'],
    ]);
    // Names and times only: what the client sent is nowhere, though the audit level keeps content.
    expect(out.stdout).not.toContain('zebra-quokka');
  });

  it('--json gives the same segments with ISO times, offsets and durations', async () => {
    const out = await keelCli('runs', 'timeline', runId, '--json');
    expect(out.code).toBe(0);
    const body = JSON.parse(out.stdout) as Json;
    expect(body).toMatchObject({ id: runId, agent: 'order', status: 'completed', inProgress: false });
    expect(body.segments.map((segment: Json) => [segment.kind, segment.wait ?? null, segment.label])).toEqual([
      ['state', null, 'queued'],
      ['state', null, 'checking'],
      ['step', null, 'step check'],
      ['state', null, 'asking'],
      ['wait', 'input', 'input for askInput'],
      ['state', null, 'paying'],
      ['step', null, 'step pay'],
      ['state', null, 'done'],
    ]);
    expect(out.stdout).not.toContain('zebra-quokka');
    const start = Date.parse(body.start);
    for (const segment of body.segments as Json[]) {
      expect(Date.parse(segment.start) - start).toBe(segment.offsetMs);
      expect(Date.parse(segment.end) - Date.parse(segment.start)).toBe(segment.durationMs);
      expect(segment.open).toBe(false);
      expect(Date.parse(segment.end)).toBeLessThanOrEqual(Date.parse(body.end));
    }
    const wait = body.segments.find((segment: Json) => segment.kind === 'wait');
    const asking = body.segments.find((segment: Json) => segment.label === 'asking');
    // The wait lies inside the state that asked.
    expect(wait.offsetMs).toBeGreaterThanOrEqual(asking.offsetMs);
    expect(wait.offsetMs + wait.durationMs).toBeLessThanOrEqual(asking.offsetMs + asking.durationMs);
  });

  it('a run that does not exist, and an id that is no run id', async () => {
    const missing = await keelCli('runs', 'timeline', '00000000-0000-4000-8000-000000000000');
    expect(missing.code).not.toBe(0);
    expect(missing.stderr).toContain('run 00000000-0000-4000-8000-000000000000 not found');
    const bad = await keelCli('runs', 'timeline', 'nope');
    expect(bad.stderr).toContain('"nope" is not a run id');
  });
});
