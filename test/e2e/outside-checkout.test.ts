import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { Task } from '@a2a-js/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sdkClient, textMessage } from '../support/a2a-client.js';
import { cleanEnv, REPO_ROOT } from '../support/keel-process.js';
import { createEmptyDatabase } from '../support/test-database.js';
import { TEST_POOL_ENV, tempDir } from '../support/test-keel.js';
import { deleteQueueKeys, TEST_REDIS_URL, testQueueKind, testQueuePrefix } from '../support/test-queues.js';

// Keel as a team gets it (docs/statechart-agents.md): `npm pack` of this checkout, `keel new
// project` taking Keel from the tarball, the project's own `npm install` (Keel installed outside
// the checkout), `npm test`, the installed package's `npx keel new project`, `npm start`, and one
// task through the official client. The project's Keel runs on
// this file's database (the embedded default is covered by embedded-start.test.ts).

type Ran = { code: number | null; output: string; ms: number };

const work = tempDir('keel-outside-');
const project = join(work, 'app');
const prefix = testQueuePrefix();
let database: Awaited<ReturnType<typeof createEmptyDatabase>> | null = null;
let tarball = '';
let keelGroup: number | null = null;

/** The environment of a user's shell: none of the suite's KEEL_* settings, and none of npm's own from `npm test`. */
function userEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env = cleanEnv({ NO_COLOR: '1', npm_config_update_notifier: 'false', ...extra });
  for (const key of Object.keys(env)) if (key.toLowerCase().startsWith('npm_') && key !== 'npm_config_update_notifier') delete env[key];
  return env;
}

function run(command: string, args: string[], cwd: string, env = userEnv()): Promise<Ran> {
  const started = Date.now();
  const child = spawn(command, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, output, ms: Date.now() - started })));
}

function expectSuccess(ran: Ran, what: string): void {
  if (ran.code !== 0) throw new Error(`${what} exited ${ran.code}:\n${ran.output}`);
}

const INSTALL = ['--prefer-offline', '--no-audit', '--no-fund'];
/** npm pack (it builds dist/) and each install took 2 to 4 minutes on a 2-core machine at load average 20. */
const STEP_TIMEOUT_MS = 420_000;

beforeAll(async () => {
  database = await createEmptyDatabase();
});

afterAll(async () => {
  if (keelGroup !== null) {
    try {
      process.kill(-keelGroup, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }
  await database?.drop();
  if (testQueueKind() === 'redis') await deleteQueueKeys([prefix]);
  // An install of Keel: tens of thousands of files, slow to remove on a loaded disk.
  await rm(work, { recursive: true, force: true });
}, STEP_TIMEOUT_MS);

describe('Keel outside its checkout', () => {
  it('npm pack makes a package with the compiled build and the declarations, and no sources', async () => {
    const packed = await run('npm', ['pack', '--json', '--pack-destination', work], REPO_ROOT);
    expectSuccess(packed, 'npm pack');
    const [info] = JSON.parse(packed.output.slice(packed.output.indexOf('[\n'))) as Array<{ filename: string; files: Array<{ path: string }> }>;
    tarball = join(work, info!.filename);
    const paths = info!.files.map((file) => file.path);
    expect(paths).toEqual(expect.arrayContaining(['bin/keel.js', 'lib/statechart.js', 'dist/src/cli/main.js', 'dist/src/statecharts/steps.js', 'dist/src/statecharts/steps.d.ts', 'dist/machines/run.machine.js', 'dist/sql/0001_runs.sql', 'package.json']));
    expect(paths.filter((path) => path.startsWith('src/') || path.startsWith('test/'))).toEqual([]);
  }, STEP_TIMEOUT_MS);

  it('`keel new project` writes a repository that takes Keel from the tarball', async () => {
    // The scaffold is written by this checkout's keel (the same code the tarball holds, compiled):
    // a second install of Keel only to run its scaffold cost CI minutes. The installed package's
    // own `keel new project` is run below, once the project has installed it.
    const created = await run(process.execPath, [join(REPO_ROOT, 'bin', 'keel.js'), 'new', 'project', project, '--keel', `file:${tarball}`], work);
    expectSuccess(created, 'keel new project');
    expect(created.output).toContain(`keel: file:${tarball}`);
    const manifest = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8')) as Record<string, Record<string, string>>;
    expect(manifest.type).toBe('module');
    expect(manifest.dependencies).toEqual({ keel: `file:${tarball}`, xstate: expect.any(String) });
    expect(Object.keys(manifest.devDependencies!)).toEqual(['vitest']);
  }, STEP_TIMEOUT_MS);

  it("the project's npm install and npm test pass, and the installed keel scaffolds too", async () => {
    expectSuccess(await run('npm', ['install', ...INSTALL], project), 'npm install in the project');
    expect(existsSync(join(project, 'node_modules', 'keel', 'src'))).toBe(false);
    const tested = await run('npm', ['test'], project);
    expectSuccess(tested, 'npm test in the project');
    expect(tested.output).toMatch(/Tests\s+2 passed \(2\)/);

    // The package's own bin: it runs the build in dist/ (no src/ beside it) and records where it came from.
    const second = join(work, 'second');
    const created = await run('npx', ['keel', 'new', 'project', second], project);
    expectSuccess(created, 'npx keel new project (the installed package)');
    expect(created.output).toContain(`keel: file:${tarball}`);
    const again = await run('npx', ['keel', 'new', 'project', second], project);
    expect(again.code).toBe(64);
    expect(again.output).toContain(`keel: cannot create project in ${second}: the directory is not empty`);
  }, STEP_TIMEOUT_MS);

  it('npm start serves the agent, and the official client gets its answer', async () => {
    const queue: Record<string, string> = testQueueKind() === 'redis' ? { KEEL_QUEUE_REDIS_URL: TEST_REDIS_URL, KEEL_QUEUE_PREFIX: prefix } : { KEEL_QUEUE_PREFIX: prefix };
    const env = userEnv({ KEEL_DATABASE_URL: database!.url, KEEL_SERVER_PORT: '0', KEEL_LOG_LEVEL: 'info', ...TEST_POOL_ENV, ...queue });
    // Its own process group: npm, its shell and Keel are stopped together.
    const child = spawn('npm', ['start'], { cwd: project, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    keelGroup = child.pid!;
    let output = '';
    const ready = new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`npm start was not ready in 60 s:\n${output}`)), 60_000);
      const onData = (chunk: Buffer) => {
        output += chunk.toString('utf8');
        // Whole lines only; npm's own lines are not JSON.
        for (const line of output.split('\n').slice(0, -1)) {
          if (!line.startsWith('{')) continue;
          const parsed = JSON.parse(line) as { msg?: string; url?: string };
          if (parsed.msg === 'keel is ready' && parsed.url) {
            clearTimeout(timer);
            resolve(parsed.url);
          }
        }
      };
      child.stdout.on('data', onData);
      child.stderr.on('data', onData);
      child.on('exit', (code) => reject(new Error(`npm start exited (${code}):\n${output}`)));
    });
    const url = await ready;
    const token = readFileSync(join(project, '.keel', 'local-client.token'), 'utf8').trim();
    const client = await sdkClient(url, 'assistant', token);
    const task = Task.toJSON((await client.sendMessage(textMessage('where is my order?'))) as Task) as {
      status: { state: string };
      artifacts: Array<{ parts: Array<{ text?: string }> }>;
    };
    expect(task.status.state).toBe('TASK_STATE_COMPLETED');
    expect(task.artifacts.flatMap((artifact) => artifact.parts.map((part) => part.text))).toContain('echo: where is my order?');

    process.kill(-keelGroup, 'SIGTERM');
    await new Promise((resolve) => child.on('exit', resolve));
    keelGroup = null;
  }, STEP_TIMEOUT_MS);
});
