import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { cleanEnv, REPO_ROOT, runKeel } from '../support/keel-process.js';
import { cliEnvFor, startTestKeel, type TestKeel } from '../support/test-keel.js';
import { waitFor } from '../support/wait-for.js';
import {
  LOOPBACK,
  callbacksOfDependency,
  delegatingOverrides,
  dependenciesOf,
  freePort,
  newToken,
  registrationsOf,
  sendLocal,
  startSdkRemote,
  waitForLocalTask,
  type DependencyView,
  type RemoteAgentInput,
  type SdkRemote,
} from '../integration/remote/remote-support.js';

// The operator's view of the client role, as `keel` child processes against a running Keel:
// `keel remote list` (configured remote agents and the status of their cached cards) and
// `keel deps list|show` (dependencies, their registrations and the callbacks received).

let keel: TestKeel;
let remote: SdkRemote;
let env: NodeJS.ProcessEnv;
let sdkDependency: DependencyView;
const keelCli = (...args: string[]) => runKeel(args, { cwd: REPO_ROOT, env });
const ISO = '\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z';

beforeAll(async () => {
  vi.spyOn(console, 'info').mockImplementation(() => undefined);
  remote = await startSdkRemote({ push: true, completeAfterMs: 300 });
  const closedPort = await freePort();
  const remotes: RemoteAgentInput[] = [
    { id: 'sdk', cardUrl: remote.cardUrl, credentialEnv: 'SDK_REMOTE_TOKEN' },
    { id: 'down', cardUrl: `http://${LOOPBACK}:${closedPort}/.well-known/agent-card.json` },
    { id: 'later', cardUrl: `http://${LOOPBACK}:${closedPort}/later/.well-known/agent-card.json`, credentialSealed: 'bm90LW9wZW5lZC1pbi10aGlzLXRlc3Q=' },
  ];
  keel = await startTestKeel({ env: { SDK_REMOTE_TOKEN: 'sdk-token' }, overrides: delegatingOverrides(remotes) });
  // The CLI reads the same config: the remote agents come from the environment here too.
  env = cleanEnv({ ...cliEnvFor(keel), KEEL_REMOTE_AGENTS: JSON.stringify(remotes), KEEL_LOG_LEVEL: 'warn' });

  const token = await newToken(keel.context.pool);
  const sdk = await sendLocal(keel, token, 'to-sdk', 'go');
  const down = await sendLocal(keel, token, 'to-down', 'go');
  expect((await waitForLocalTask(keel, token, 'to-sdk', sdk.taskId)).status?.state).toBe(3);
  await waitForLocalTask(keel, token, 'to-down', down.taskId);
  [sdkDependency] = (await dependenciesOf(keel.context.pool, sdk.runId)) as DependencyView[];
  // The SDK pushed its four events; wait until all are stored and processed.
  await waitFor(async () => {
    const rows = await callbacksOfDependency(keel.context.pool, sdkDependency.id);
    return rows.length === 4 && rows.every((row) => row.processed_at !== null);
  }, 'the four callbacks of the SDK remote');
  sdkDependency = (await dependenciesOf(keel.context.pool, sdk.runId))[0]!;
});
afterAll(async () => {
  await keel?.dispose();
  await remote?.close();
});

describe('keel remote', () => {
  it('list shows each configured remote agent, its credential source and its card status', async () => {
    const listed = await keelCli('remote', 'list');
    expect(listed.stderr).toBe('');
    expect(listed.code).toBe(0);
    const lines = listed.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^ID\s+CARD\s+CREDENTIAL\s+STATUS\s+FETCHED$/);
    expect(lines).toHaveLength(4);
    const row = (id: string) => lines.find((line) => line.startsWith(`${id} `)) ?? '';
    expect(row('sdk')).toMatch(new RegExp(`^sdk\\s+${remote.cardUrl.replace(/[.]/g, '\\.')}\\s+env SDK_REMOTE_TOKEN\\s+ok \\(SDK test remote\\)\\s+${ISO}$`));
    expect(row('down')).toMatch(/^down\s+http:\/\/127\.0\.0\.1:\d+\/\.well-known\/agent-card\.json\s+none\s+error: card request failed \(connection\)\s+-$/);
    expect(row('later')).toMatch(/^later\s+\S+\s+sealed\s+not fetched yet\s+-$/);
    // The credentials themselves are never shown.
    expect(listed.stdout).not.toContain('sdk-token');
  });
});

describe('keel deps', () => {
  it('list shows the dependency with its state, outcome and callbacks', async () => {
    const listed = await keelCli('deps', 'list');
    expect(listed.stderr).toBe('');
    expect(listed.code).toBe(0);
    const lines = listed.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^ID\s+RUN\s+REMOTE\s+STATE\s+OUTCOME\s+CALLBACKS\s+CREATED$/);
    // The unreachable remote never got a message: no dependency for it.
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatch(new RegExp(`^${sdkDependency.id}\\s+${sdkDependency.run_id}\\s+sdk\\s+resolved\\s+completed\\s+4 \\(0 unprocessed\\)\\s+${ISO}$`));

    const waiting = await keelCli('deps', 'list', '--state', 'waiting');
    expect(waiting.code).toBe(0);
    expect(waiting.stdout.trimEnd().split('\n')).toHaveLength(1);
    const resolved = await keelCli('deps', 'list', '--state', 'resolved');
    expect(resolved.stdout).toContain(sdkDependency.id);
  });

  it('show prints the dependency, its registration count and every callback received', async () => {
    const [registration] = await registrationsOf(keel.context.pool, sdkDependency.id);
    expect(registration).toBeDefined();
    const shown = await keelCli('deps', 'show', sdkDependency.id);
    expect(shown.stderr).toBe('');
    expect(shown.code).toBe(0);
    const out = shown.stdout;
    expect(out).toMatch(new RegExp(`^id\\s+${sdkDependency.id}$`, 'm'));
    expect(out).toMatch(new RegExp(`^run_id\\s+${sdkDependency.run_id}$`, 'm'));
    expect(out).toMatch(/^remote_agent\s+sdk$/m);
    expect(out).toMatch(/^state\s+resolved$/m);
    expect(out).toMatch(/^outcome\s+completed$/m);
    expect(out).toMatch(new RegExp(`^remote_task_id\\s+${sdkDependency.remote_task_id}$`, 'm'));
    expect(out).toMatch(new RegExp(`^resolved_at\\s+${ISO}$`, 'm'));
    expect(out).toMatch(/^registrations\s+1$/m);
    expect(out).toMatch(/^callbacks\s+4$/m);
    expect(out).toMatch(/^unprocessed\s+0$/m);
    const received = out.split('callbacks received')[1]!.trim().split('\n').slice(1);
    expect(received).toHaveLength(4);
    expect(received.map((line) => line.trim().split(/\s+/)[1])).toEqual(['task', 'statusUpdate', 'artifactUpdate', 'statusUpdate']);
    for (const line of received) expect(line).toMatch(new RegExp(`^\\s+${ISO}\\s+\\w+\\s+processed ${ISO}$`));
    // Neither the callback credential nor its hash is printed.
    expect(out).not.toContain(registration!.credential_hash_hex);
  });

  it('show of an unknown dependency exits 6; of something that is no id, 64', async () => {
    const unknown = await keelCli('deps', 'show', '00000000-0000-4000-8000-000000000000');
    expect(unknown.code).toBe(6);
    expect(unknown.stdout).toBe('');
    expect(unknown.stderr).toContain('dependency 00000000-0000-4000-8000-000000000000 not found');
    const bad = await keelCli('deps', 'show', 'nonsense');
    expect(bad.code).toBe(64);
    expect(bad.stderr).toContain('"nonsense" is not a dependency id');
  });
});
