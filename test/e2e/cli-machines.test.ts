import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { MachineDiffReport } from '../../src/cli/machines-command.js';
import { recordMachineDefinitions } from '../../src/statecharts/definition-repository.js';
import { definitionHash, loadStatechart } from '../../src/statecharts/statechart-definition.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { insertMachineRun } from '../support/statechart-rows.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';
import { machine as refund } from '../fixtures/statecharts/ui-refund.machine.js';
import { machine as refundV2 } from '../fixtures/statecharts/ui-refund-v2.machine.js';

// `keel machines <agent>` prints a statechart agent's machine (Mermaid, JSON, SVG) from the config;
// `keel machines diff <agent>` compares the versions its open runs started with against the
// current one: what changed, and which open runs stand in a state the current version lacks. And
// the errors a person gets: an unknown name, an agent without a machine, no database.

const V1 = fileURLToPath(new URL('../fixtures/statecharts/ui-refund.machine.ts', import.meta.url));
const V2 = fileURLToPath(new URL('../fixtures/statecharts/ui-refund-v2.machine.ts', import.meta.url));
const HASH = definitionHash(refund);
const HASH_V2 = definitionHash(refundV2);

let keel: TestKeel;
const runs: Record<string, string> = {};

/** The environment of a CLI child whose config names the refund agent with the given machine. */
const envWith = (machine: string, extra: Record<string, string> = {}) =>
  cleanEnv({
    ...cliEnvFor(keel),
    KEEL_LOG_LEVEL: 'error',
    KEEL_PROVIDERS: JSON.stringify({ echo: { type: 'echo' } }),
    KEEL_AGENTS: JSON.stringify([
      { id: 'echo', name: 'Echo', provider: 'echo' },
      { id: 'refund', name: 'Refund', machine },
    ]),
    ...extra,
  });
const keelCli = (env: NodeJS.ProcessEnv, ...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_PROVIDERS: { echo: { type: 'echo' } },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'refund', name: 'Refund', machine: V1 },
      ],
    },
  });
  const pool = keel.context.pool;
  runs.classifying = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH, state: 'classifying' });
  runs.confirming = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH, state: 'confirming' });
  runs.notStarted = await insertMachineRun(pool, { agent: 'refund', status: 'waiting_for_dependency', hash: null, state: null });
  runs.settled = await insertMachineRun(pool, { agent: 'refund', status: 'completed', hash: HASH, state: 'confirming' });
});
afterAll(async () => keel?.dispose());

describe('keel machines <agent>', () => {
  it('prints the machine as Mermaid, JSON or SVG', async () => {
    const env = envWith(V1);
    const mermaid = await keelCli(env, 'machines', 'refund');
    expect(mermaid.stderr).toBe('');
    expect(mermaid.code).toBe(0);
    expect(mermaid.stdout.split('\n')[0]).toBe(`%% agent refund (statechart, version ${HASH}, ${V1})`);
    expect(mermaid.stdout).toContain('stateDiagram-v2');
    expect(mermaid.stdout).toContain('[*] --> classifying');
    expect(mermaid.stdout).toContain('classifying --> review : done(classify) [large]');
    expect(mermaid.stdout).toContain('review --> s_review_approval : initial');
    expect(mermaid.stdout).toContain('confirming --> done : after(1h)');

    const json = await keelCli(env, 'machines', 'refund', '--format', 'json');
    expect(json.code).toBe(0);
    const parsed = JSON.parse(json.stdout) as { machines: Array<{ id: string; version: string; initial: string; states: Array<{ name: string; kind: string }>; transitions: Array<{ label: string }> }> };
    expect(parsed.machines).toHaveLength(1);
    expect(parsed.machines[0]).toMatchObject({ id: 'refund', version: HASH, initial: 'classifying' });
    expect(parsed.machines[0]!.states.map((state) => state.name)).toEqual(['classifying', 'review', 'review.approval', 'review.approved', 'paying', 'confirming', 'done', 'rejected', 'failed']);
    expect(parsed.machines[0]!.states.find((state) => state.name === 'review')!.kind).toBe('compound');
    expect(parsed.machines[0]!.transitions.map((edge) => edge.label)).toContain('done(approve)');

    const svg = await keelCli(env, 'machines', 'refund', '--format', 'svg');
    expect(svg.code).toBe(0);
    expect(svg.stdout.startsWith('<svg')).toBe(true);
    expect(svg.stdout).toContain('<style>');
    expect(svg.stdout).toContain('data-state="review.approval"');
  });

  it('still prints the lifecycle machines, with or without a config', async () => {
    const run = await keelCli(envWith(V1), 'machines', 'run');
    expect(run.code).toBe(0);
    expect(run.stdout).toContain('%% run (machines/run.machine.ts)');
    const bare = await keelCli(cleanEnv({ KEEL_LOG_LEVEL: 'error' }), 'machines', '--format', 'json');
    expect(bare.code).toBe(0);
    expect((JSON.parse(bare.stdout) as { machines: Array<{ id: string }> }).machines.map((machine) => machine.id)).toEqual(expect.arrayContaining(['run', 'task', 'delivery']));
  });

  it('answers an unknown name, an agent without a machine and a machine that cannot load plainly', async () => {
    const unknown = await keelCli(envWith(V1), 'machines', 'nobody');
    expect(unknown.code).toBe(6);
    expect(unknown.stderr).toContain('no machine or agent nobody; there are machines run, task');
    expect(unknown.stderr).toContain('statechart agents refund');
    const plain = await keelCli(envWith(V1), 'machines', 'echo');
    expect(plain.code).toBe(6);
    expect(plain.stderr).toContain('agent echo is not a statechart agent: its config names no machine (statechart agents: refund)');
    const broken = await keelCli(envWith('/no/such/refund.machine.ts'), 'machines', 'refund');
    expect(broken.code).toBe(2);
    expect(broken.stderr).toContain('the machine of agent refund cannot be used');
    expect(broken.stderr).not.toContain('    at ');
    const badFormat = await keelCli(envWith(V1), 'machines', 'refund', '--format', 'png');
    expect(badFormat.code).toBe(64);
  });
});

describe('keel machines diff <agent>', () => {
  it('lists the versions open runs started with, what changed, and the runs the current version strands', async () => {
    const before = await keelCli(envWith(V1), 'machines', 'diff', 'refund');
    expect(before.stderr).toBe('');
    expect(before.code).toBe(0);
    expect(before.stdout).toContain(`agent refund: machine ${V1}, current version ${HASH}\n`);
    expect(before.stdout).toMatch(new RegExp(`${HASH}\\s+2\\s+current`));
    expect(before.stdout).toMatch(/not started yet\s+1/);
    expect(before.stdout).toContain('no older version of this machine is recorded.');
    expect(before.stdout).toContain('no open run stands in a state, or waits on a step, the current version lacks.');

    // The next version is deployed in the config, not yet started by any process.
    const after = await keelCli(envWith(V2), 'machines', 'diff', 'refund');
    expect(after.stderr).toBe('');
    expect(after.code).toBe(0);
    const out = after.stdout;
    expect(out).toContain(`current version ${HASH_V2} (not recorded yet: no Keel process has started with it)`);
    expect(out).toContain(`version ${HASH} (first seen `);
    expect(out).toContain('; 2 open run(s) started with it), changed in the current one:');
    expect(out).toContain('  states added:\n    notifying\n  states removed:\n    confirming\n');
    expect(out).toContain('  transitions added:\n    notifying --done(notify)--> done\n    paying --done(pay)--> notifying\n');
    expect(out).toContain('  transitions removed:\n    confirming --after(1h)--> done\n    confirming --done(ask)--> done\n    paying --done(pay)--> confirming\n');
    expect(out).not.toContain('invokes changed');
    expect(out).toContain('open runs in a state, or waiting on a step, the current version lacks (1): resumed, they fail with not_retryable');
    expect(out).toMatch(new RegExp(`${runs.confirming}\\s+waiting_for_input\\s+confirming\\s+state confirming\\s+${HASH}`));
    expect(out).not.toContain(runs.classifying);
    expect(out).not.toContain(runs.settled);

    // Once a process ran it, it is recorded; its runs are the current version's.
    const loaded = await loadStatechart(V2, '/', 'test');
    if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
    await recordMachineDefinitions(keel.context.pool, { agents: new Map([['refund', { statechart: loaded.definition }]]) });
    await insertMachineRun(keel.context.pool, { agent: 'refund', status: 'waiting_for_input', hash: HASH_V2, state: 'notifying' });
    const json = await keelCli(envWith(V2), 'machines', 'diff', 'refund', '--json');
    expect(json.code).toBe(0);
    const report = JSON.parse(json.stdout) as MachineDiffReport;
    expect(report.current).toEqual({ version: HASH_V2, recorded: true });
    expect(report.openRuns).toEqual([
      { version: HASH_V2, runs: 1, current: true, recorded: true },
      { version: HASH, runs: 2, current: false, recorded: true },
      { version: null, runs: 1, current: false, recorded: false },
    ]);
    expect(report.versions).toHaveLength(1);
    expect(report.versions[0]).toMatchObject({ version: HASH, openRuns: 2, changes: { statesAdded: ['notifying'], statesRemoved: ['confirming'] } });
    expect(report.stranded).toEqual({
      total: 1,
      runs: [{ id: runs.confirming, status: 'waiting_for_input', state: 'confirming', missing: ['confirming'], steps: [], startedWith: HASH }],
    });

    // Back on the first version, the second one is the older one, and its run in "notifying" is stranded.
    const back = await keelCli(envWith(V1), 'machines', 'diff', 'refund', '--json');
    const backReport = JSON.parse(back.stdout) as MachineDiffReport;
    expect(backReport.versions.map((version) => [version.version, version.changes?.statesAdded, version.changes?.statesRemoved])).toEqual([[HASH_V2, ['confirming'], ['notifying']]]);
    expect(backReport.stranded.runs.map((run) => run.state)).toEqual(['notifying']);
  });

  it('answers an unknown agent, an agent without a machine and no database plainly', async () => {
    const unknown = await keelCli(envWith(V1), 'machines', 'diff', 'nobody');
    expect(unknown.code).toBe(6);
    expect(unknown.stderr).toContain('no machine or agent nobody');
    const plain = await keelCli(envWith(V1), 'machines', 'diff', 'echo');
    expect(plain.code).toBe(6);
    expect(plain.stderr).toContain('agent echo is not a statechart agent');
    const missing = await keelCli(envWith(V1), 'machines', 'diff');
    expect(missing.code).toBe(64);
    const noDatabase = await keelCli(envWith(V1, { KEEL_DATABASE_URL: 'postgres://root@127.0.0.1:1/keel' }), 'machines', 'diff', 'refund');
    expect(noDatabase.code).toBe(3);
    expect(noDatabase.stderr).toContain('keel: cannot reach the database:');
    expect(noDatabase.stderr).not.toContain('    at ');
  });
});
