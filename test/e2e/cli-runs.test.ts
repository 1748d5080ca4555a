import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getRun } from '../../src/runs/run-repository.js';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { startRun, TERMINAL, TEST_TOOLS_MODULE } from '../support/run-helpers.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitForRunStatus } from '../support/wait-for.js';

// The operator's commands against a running Keel: show a waiting turn, approve or deny it by its
// digest, cancel, list; and the errors a person gets for bad input.

let keel: TestKeel;
let env: NodeJS.ProcessEnv;
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: {
      KEEL_TOOL_MODULES: JSON.stringify([TEST_TOOLS_MODULE]),
      KEEL_PROVIDERS: {
        echo: { type: 'echo' },
        mailer: { type: 'scripted', steps: [{ toolCalls: [{ name: 'send_email', arguments: { to: 'ops@example.com' } }] }, { reply: 'mail handled' }] },
      },
      KEEL_AGENTS: [
        { id: 'echo', name: 'Echo', provider: 'echo' },
        { id: 'mailer', name: 'Mailer', provider: 'mailer', tools: ['send_email'] },
      ],
    },
  });
  env = cleanEnv(cliEnvFor(keel));
});
afterAll(async () => keel?.dispose());

function digestFrom(output: string): string {
  const match = /turn digest ([0-9a-f]{64})/.exec(output);
  if (!match) throw new Error(`no digest in:\n${output}`);
  return match[1]!;
}

describe('keel runs', () => {
  it('show prints the pending calls and the digest; approve resumes the run', async () => {
    const id = await startRun(keel, 'mailer', 'tell ops');
    await waitForRunStatus(keel.context.pool, id, ['waiting_for_approval']);
    const shown = await keelCli('runs', 'show', id);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toMatch(/status\s+waiting_for_approval/);
    expect(shown.stdout).toContain('send_email {"to":"ops@example.com"}');
    const digest = digestFrom(shown.stdout);

    const stale = await keelCli('runs', 'approve', id, '--turn', '0'.repeat(64));
    expect(stale.code).toBe(1);
    expect(stale.stderr).toContain('is not the turn run');

    const approved = await keelCli('runs', 'approve', id, '--turn', digest);
    expect(approved.stderr).toBe('');
    expect(approved.code).toBe(0);
    const run = await waitForRunStatus(keel.context.pool, id, TERMINAL);
    expect(run).toMatchObject({ status: 'completed', tool_calls: 1 });

    const again = await keelCli('runs', 'deny', id, '--turn', digest);
    expect(again.code).toBe(1);
    expect(again.stderr).toContain('is completed, not waiting for approval');
  });

  it('deny resumes the run without the tool; show prints the timeline', async () => {
    const id = await startRun(keel, 'mailer', 'tell ops');
    await waitForRunStatus(keel.context.pool, id, ['waiting_for_approval']);
    const digest = digestFrom((await keelCli('runs', 'show', id)).stdout);
    expect((await keelCli('runs', 'deny', id, '--turn', digest)).code).toBe(0);
    await waitForRunStatus(keel.context.pool, id, TERMINAL);
    const shown = await keelCli('runs', 'show', id);
    expect(shown.stdout).toMatch(/events \(audit level metadata\)/);
    expect(shown.stdout).toMatch(/approval_decided .*"approved":false/);
    const json = JSON.parse((await keelCli('runs', 'show', id, '--json')).stdout);
    expect(json).toMatchObject({ id, status: 'completed', toolCalls: 0 });
  });

  it('cancel and list', async () => {
    const id = await startRun(keel, 'mailer', 'tell ops');
    await waitForRunStatus(keel.context.pool, id, ['waiting_for_approval']);
    const cancelled = await keelCli('runs', 'cancel', id);
    expect(cancelled).toMatchObject({ code: 0, stdout: `run ${id} cancelled\n` });
    expect((await getRun(keel.context.pool, id))!.status).toBe('cancelled');
    const twice = await keelCli('runs', 'cancel', id);
    expect(twice.code).toBe(1);
    expect(twice.stderr).toContain('already cancelled');
    const listed = await keelCli('runs', 'list', '--status', 'cancelled', '--json');
    expect(listed.stdout.trim().split('\n').map((line) => JSON.parse(line).id)).toContain(id);
  });

  it('bad input gets a clear message and an exit code, never a stack trace', async () => {
    const notUuid = await keelCli('runs', 'show', 'nope');
    expect(notUuid).toMatchObject({ code: 64 });
    expect(notUuid.stderr).toBe('keel: "nope" is not a run id (expected a UUID)\n');
    const missing = await keelCli('runs', 'show', '00000000-0000-4000-8000-000000000000');
    expect(missing.code).toBe(6);
    const badStatus = await keelCli('runs', 'list', '--status', 'bogus');
    expect(badStatus.code).toBe(64);
    const noTurn = await keelCli('runs', 'approve', '00000000-0000-4000-8000-000000000000');
    expect(noTurn.code).toBe(64);
    expect(noTurn.stderr).toContain("required option '--turn <digest>'");
    const badConfig = await runKeel(['doctor'], { cwd: REPO_ROOT, env: { ...env, KEEL_SERVER_PORT: 'eighty' } });
    expect(badConfig.code).toBe(2);
    expect(badConfig.stdout).toContain('server.port: expected a number, got "eighty" (from KEEL_SERVER_PORT)');
    const unreachable = await runKeel(['runs', 'list'], { cwd: REPO_ROOT, env: { ...env, KEEL_DATABASE_URL: 'postgres://root@127.0.0.1:1/keel' } });
    expect(unreachable.code).toBe(3);
    expect(unreachable.stderr).toBe('keel: cannot reach the database: connect ECONNREFUSED 127.0.0.1:1\n');
    const help = await keelCli('runs', '--help');
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('approve');
  });

  it('doctor reports each check', async () => {
    const doctor = await keelCli('doctor');
    expect(doctor.code).toBe(0);
    expect(doctor.stdout).toMatch(/ok\s+config/);
    expect(doctor.stdout).toMatch(/ok\s+database\s+external; schema current/);
    expect(doctor.stdout).toMatch(new RegExp(`ok\\s+queue\\s+${keel.context.queues.backend.kind}`));
    expect(doctor.stdout).toMatch(/ok\s+master key active [0-9a-f]{16} \(KEEL_MASTER_KEY\)/);
    const wrongKey = await runKeel(['doctor'], { cwd: REPO_ROOT, env: { ...env, KEEL_MASTER_KEY: Buffer.alloc(32, 7).toString('base64') } });
    expect(wrongKey.code).toBe(5);
    expect(wrongKey.stdout).toMatch(/FAIL\s+master key the database needs key [0-9a-f]{16}/);
  });
});
