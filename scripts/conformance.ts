import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { guard, interrupted, ManagedChild, repoRoot, runBench, throwIfInterrupted, unguard, waitUntilReady, withAdmin } from '../bench/keel-harness.js';
import { ADMIN_URL } from '../bench/support.js';
import { loadConfig, type KeelConfig } from '../src/config/load-config.js';
import { encodeMasterKey, generateMasterKey } from '../src/sealing/master-key.js';

// npm run conformance — the public A2A conformance kit (github.com/a2aproject/a2a-tck, branch
// 1.0-dev) against a Keel started for the run (docs/conformance.md):
//   1. a fresh database, a new master key and a data directory of the run's own; Keel started with
//      test/conformance.config.yaml on that config's ports, waited for on /readyz;
//   2. the kit's tests/compatibility on every binding the root card lists (jsonrpc, http_json, and
//      grpc when the config turns gRPC on);
//   3. CORE-CAP-004 against the agent that requires the kit's extension (the kit tests it only on
//      the root card, where a required extension would fail every other test);
//   4. a summary: passed/failed/skipped per transport, every failure (MUST ones apart), the skips by
//      reason; then Keel stopped, the database dropped. Exits 1 when a test failed, 2 when the run
//      could not be made.
// Per-test results come from scripts/conformance-kit-recorder.py, which runs the kit's pytest; the
// kit's own reports (compatibility.{json,html}, junit.xml) and the recorder's results.jsonl are
// left in .tmp/conformance/.
//
// Environment:
//   A2A_TCK_DIR          a checkout of the kit (required)
//   A2A_TCK_PYTHON       a python with the kit's dependencies (required; docs/conformance.md)
//   A2A_TCK_PYTEST_ARGS  more pytest arguments for the root agent's run, split on spaces ("-k Push -x")
//   KEEL_LOG_LEVEL       Keel's log level (warn); no other KEEL_* variable is passed on, so the run
//                        is the config file's (the queue on Postgres)
//   KEEL_BENCH_ADMIN_URL the Postgres server the run's database is made on, as for the benches
//                        (postgres://postgres@127.0.0.1:5432/postgres)

const CONFIG = join(repoRoot, 'test/conformance.config.yaml');
const RECORDER = join(repoRoot, 'scripts/conformance-kit-recorder.py');
const REPORTS = join(repoRoot, '.tmp/conformance');
const REQUIRED_EXTENSION = 'urn:a2a:tck:required-extension';
/** The kit's pytest run may take this long (the whole suite takes about two minutes). */
const KIT_TIMEOUT_MS = 30 * 60_000;
/** The host name of the kit's push config tests; the address guard resolves it when a config is created. */
const KIT_WEBHOOK_HOST = 'example.com';

/** Kit entries whose test contradicts the requirement it cites, shown beside such a failure. */
const KIT_DEFECTS: Record<string, { runnerMessage: string; note: string }> = {
  'CORE-SEND-003': {
    // The generic runner's message when it expected a success and got an error.
    runnerMessage: 'Operation failed:',
    note: 'kit defect (a2aproject/a2a-tck#202): the requirement entry names no expected_error, so the runner expects the unsupported media type to be accepted',
  },
};

const BINDINGS: Record<string, string> = { JSONRPC: 'jsonrpc', 'HTTP+JSON': 'http_json', GRPC: 'grpc' };
const TRANSPORT_LABELS: Record<string, string> = { jsonrpc: 'JSON-RPC', http_json: 'HTTP+JSON', grpc: 'gRPC' };
const NO_TRANSPORT = 'transport-independent';

type Status = 'passed' | 'failed' | 'skipped';
type TestResult = {
  nodeid: string;
  transport: string | null;
  requirement: string | null;
  level: 'MUST' | 'SHOULD' | 'MAY' | null;
  status: Status;
  phase: string;
  message: string;
};
type KitRun = { label: string; results: TestResult[]; exitCode: number | null; reports: string; served: string[] };

function refuse(message: string): never {
  console.error(`conformance: ${message}`);
  process.exit(2);
}

// ---------------------------------------------------------------------------------------------
// Before anything is started: the kit, its python, the ports, the webhook host.

function kitFromEnvironment(): { dir: string; python: string } {
  const dir = process.env.A2A_TCK_DIR?.trim();
  const python = process.env.A2A_TCK_PYTHON?.trim();
  const setup = [
    '  git clone -b 1.0-dev https://github.com/a2aproject/a2a-tck /tmp/a2a-tck',
    '  python3 -m venv /tmp/tck-venv && /tmp/tck-venv/bin/pip install <the packages docs/conformance.md lists>',
    '  A2A_TCK_DIR=/tmp/a2a-tck A2A_TCK_PYTHON=/tmp/tck-venv/bin/python npm run conformance',
  ].join('\n');
  if (!dir) refuse(`A2A_TCK_DIR is not set: it names a checkout of the conformance kit (branch 1.0-dev), e.g.\n${setup}`);
  if (!python) refuse(`A2A_TCK_PYTHON is not set: it names a python with the kit's dependencies, e.g.\n${setup}`);
  const kitDir = resolve(dir);
  if (!existsSync(join(kitDir, 'tests/compatibility/conftest.py')) || !existsSync(join(kitDir, 'tck'))) {
    refuse(`A2A_TCK_DIR=${dir} is not a checkout of the conformance kit (no tests/compatibility/conftest.py and tck/ there)`);
  }
  try {
    // The kit's imports (tests/compatibility/conftest.py and the transports), checked up front so a
    // missing package is one clear line, not a pytest collection error after Keel has started.
    execFileSync(python, ['-c', 'import pytest, pytest_asyncio, httpx, grpc, google.protobuf, google.rpc.error_details_pb2, jsonschema, jinja2'], {
      stdio: ['ignore', 'ignore', 'pipe'],
      timeout: 60_000,
    });
  } catch (error) {
    const stderr = String((error as { stderr?: Buffer }).stderr ?? (error as Error).message).trim().split('\n').slice(-1)[0];
    refuse(`A2A_TCK_PYTHON=${python} cannot run the kit: ${stderr}\n  install the kit's dependencies into it (docs/conformance.md, "Commands")`);
  }
  return { dir: kitDir, python };
}

/** What the kit checkout is: its commit, and the branch when one is checked out. */
function describeKit(dir: string): string {
  const git = (...args: string[]) => execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  try {
    const commit = git('log', '-1', '--format=%h (%cs)');
    const branch = git('rev-parse', '--abbrev-ref', 'HEAD');
    const dirty = git('status', '--porcelain', '--untracked-files=no') !== '';
    return `a2a-tck ${commit}${branch === 'HEAD' ? '' : ` on ${branch}`}${dirty ? ', with local changes' : ''}`;
  } catch {
    return `a2a-tck at ${dir} (not a git checkout)`;
  }
}

function describeKeel(): string {
  try {
    const commit = execFileSync('git', ['-C', repoRoot, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    const dirty = execFileSync('git', ['-C', repoRoot, 'status', '--porcelain'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() !== '';
    return `Keel ${commit}${dirty ? ' with local changes' : ''}`;
  } catch {
    return 'Keel (not a git checkout)';
  }
}

async function portIsFree(host: string, port: number): Promise<boolean> {
  return new Promise((resolvePort) => {
    const server = createServer();
    server.once('error', () => resolvePort(false));
    server.listen(port, host, () => server.close(() => resolvePort(true)));
  });
}

/** The environment Keel runs with: no KEEL_* variable of the caller's, so the config file decides. */
function keelEnvironment(databaseUrl: string, masterKey: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) if (!name.startsWith('KEEL_')) env[name] = value;
  // No load balancer to drain: the run's Keel stops without the readiness delay.
  return { ...env, KEEL_DATABASE_URL: databaseUrl, KEEL_MASTER_KEY: masterKey, KEEL_LOG_LEVEL: process.env.KEEL_LOG_LEVEL ?? 'warn', KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS: '0' };
}

function loadConformanceConfig(env: NodeJS.ProcessEnv): KeelConfig {
  const loaded = loadConfig({ configPath: CONFIG, env, cwd: repoRoot });
  if (!loaded.ok) refuse(`${CONFIG}:\n  ${loaded.problems.join('\n  ')}`);
  return loaded.config;
}

// ---------------------------------------------------------------------------------------------
// The run.

async function servedTransports(cardUrl: string): Promise<string[]> {
  const response = await fetch(cardUrl, { signal: AbortSignal.timeout(10_000) });
  if (response.status !== 200) throw new Error(`${cardUrl}: HTTP ${response.status}`);
  const card = (await response.json()) as { supportedInterfaces?: { protocolBinding?: string }[] };
  const transports = (card.supportedInterfaces ?? []).map((entry) => BINDINGS[entry.protocolBinding ?? '']).filter((name): name is string => name !== undefined);
  if (transports.length === 0) throw new Error(`${cardUrl} lists no interface the kit can test`);
  return [...new Set(transports)];
}

/** Runs the kit's pytest under the recorder; resolves to its exit code (null: killed). */
async function runKit(
  kit: { dir: string; python: string },
  run: { label: string; directory: string },
  sutHost: string,
  served: string[],
  extraArgs: string[],
): Promise<KitRun> {
  const { label } = run;
  const reports = join(REPORTS, run.directory);
  mkdirSync(reports, { recursive: true });
  const resultsFile = join(reports, 'results.jsonl');
  const args = [
    RECORDER,
    resultsFile,
    'tests/compatibility',
    `--sut-host=${sutHost}`,
    `--transport=${served.join(',')}`,
    `--compatibility-report=${join(reports, 'compatibility')}`,
    `--junitxml=${join(reports, 'junit.xml')}`,
    '-p',
    'no:cacheprovider',
    '-q',
    '--tb=short',
    ...extraArgs,
  ];
  console.log(`\n=== ${label}: ${kit.python} ${args.slice(2).join(' ')}  (in ${kit.dir})`);
  // A process group of its own, so an interruption stops pytest and whatever it started.
  const child = spawn(kit.python, args, { cwd: kit.dir, stdio: ['ignore', 'inherit', 'inherit'], detached: true });
  const pid = child.pid;
  if (pid !== undefined) guard({ kind: 'group', pid });
  const killGroup = (signal: NodeJS.Signals) => {
    if (pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    try {
      process.kill(-pid, signal);
    } catch {
      // Already gone.
    }
  };
  const onAbort = () => killGroup('SIGTERM');
  interrupted.signal.addEventListener('abort', onAbort, { once: true });
  const timer = setTimeout(() => {
    console.error(`conformance: the kit ran longer than ${KIT_TIMEOUT_MS / 60_000} minutes; stopping it`);
    killGroup('SIGKILL');
  }, KIT_TIMEOUT_MS);
  const exitCode = await new Promise<number | null>((resolveExit) => {
    child.on('exit', (code) => resolveExit(code));
    child.on('error', (error) => {
      console.error(`conformance: ${kit.python}: ${error.message}`);
      resolveExit(null);
    });
  });
  clearTimeout(timer);
  interrupted.signal.removeEventListener('abort', onAbort);
  if (pid !== undefined) unguard({ kind: 'group', pid });
  throwIfInterrupted();
  const results = existsSync(resultsFile)
    ? readFileSync(resultsFile, 'utf8')
        .split('\n')
        .filter((line) => line.trim() !== '')
        .map((line) => JSON.parse(line) as TestResult)
    : [];
  return { label, results, exitCode, reports, served };
}

// ---------------------------------------------------------------------------------------------
// The summary.

type Counts = Record<Status, number>;

function countByTransport(results: TestResult[]): Map<string, Counts> {
  const counts = new Map<string, Counts>();
  for (const result of results) {
    const key = result.transport ?? NO_TRANSPORT;
    const row = counts.get(key) ?? { passed: 0, failed: 0, skipped: 0 };
    row[result.status] += 1;
    counts.set(key, row);
  }
  return counts;
}

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)));
  return rows.map((row) => row.map((cell, column) => (column === 0 ? cell.padEnd(widths[column]!) : cell.padStart(widths[column]!))).join('  ')).join('\n');
}

function transportRows(run: KitRun): string[][] {
  const counts = countByTransport(run.results);
  const order = ['jsonrpc', 'http_json', 'grpc', NO_TRANSPORT];
  const rows: string[][] = [];
  const total: Counts = { passed: 0, failed: 0, skipped: 0 };
  for (const key of [...order, ...[...counts.keys()].filter((key) => !order.includes(key))]) {
    const row = counts.get(key);
    if (!row) continue;
    const served = key === NO_TRANSPORT || run.served.includes(key);
    rows.push([`${TRANSPORT_LABELS[key] ?? key}${served ? '' : ' (not served)'}`, String(row.passed), String(row.failed), String(row.skipped)]);
    total.passed += row.passed;
    total.failed += row.failed;
    total.skipped += row.skipped;
  }
  rows.push(['all', String(total.passed), String(total.failed), String(total.skipped)]);
  return rows;
}

function testName(result: TestResult): string {
  return result.nodeid.replace(/^tests\/compatibility\//, '');
}

function failureLine(result: TestResult): string {
  const defect = result.requirement ? KIT_DEFECTS[result.requirement] : undefined;
  const note = defect && result.message.includes(defect.runnerMessage) ? `\n      ${defect.note}` : '';
  const message = result.message.split('\n')[0]!.slice(0, 300);
  return `  ${result.requirement ?? '(no requirement)'}  ${TRANSPORT_LABELS[result.transport ?? ''] ?? NO_TRANSPORT}  ${testName(result)}${result.phase === 'call' ? '' : ` (in ${result.phase})`}\n      ${message}${note}`;
}

function compatibilityLine(run: KitRun): string | null {
  try {
    const report = JSON.parse(readFileSync(join(run.reports, 'compatibility.json'), 'utf8')) as { summary?: Record<string, string> };
    const summary = report.summary ?? {};
    return `the kit's compatibility report: MUST ${summary.must_compatibility}, SHOULD ${summary.should_compatibility}, MAY ${summary.may_compatibility}`;
  } catch {
    return null;
  }
}

/** Prints the summary; returns whether the run is clean. */
function summarize(header: string[], root: KitRun, extension: KitRun | null, problems: string[]): boolean {
  const lines: string[] = ['', '=== A2A conformance kit: summary', ...header, ''];
  lines.push(table([['transport', 'passed', 'failed', 'skipped'], ...transportRows(root)]));
  const compatibility = compatibilityLine(root);
  if (compatibility) lines.push(compatibility);
  if (extension) {
    lines.push('', `required extension (${REQUIRED_EXTENSION}, CORE-CAP-004), ${extension.label}:`);
    lines.push(table([['transport', 'passed', 'failed', 'skipped'], ...transportRows(extension)]));
  }

  const runs = extension ? [root, extension] : [root];
  const failures = runs.flatMap((run) => run.results.filter((result) => result.status === 'failed'));
  const mustFailures = failures.filter((result) => result.level === 'MUST');
  const otherFailures = failures.filter((result) => result.level !== 'MUST');
  lines.push('', `MUST failures: ${mustFailures.length}`, ...mustFailures.map(failureLine));
  if (otherFailures.length > 0) lines.push('', `other failures: ${otherFailures.length}`, ...otherFailures.map(failureLine));

  // Skips by reason and transport: a skip for a feature Keel lacks shows here.
  const skips = new Map<string, number>();
  for (const result of runs.flatMap((run) => run.results.filter((entry) => entry.status === 'skipped'))) {
    const key = `${TRANSPORT_LABELS[result.transport ?? ''] ?? NO_TRANSPORT}: ${result.message.split('\n')[0]}`;
    skips.set(key, (skips.get(key) ?? 0) + 1);
  }
  if (skips.size > 0) {
    lines.push('', 'skipped, by reason:');
    for (const [reason, count] of [...skips.entries()].sort()) lines.push(`  ${String(count).padStart(3)} × ${reason}`);
  }

  for (const run of runs) {
    if (run.exitCode === null || run.exitCode > 1) problems.push(`the kit (${run.label}) exited with ${run.exitCode ?? 'a signal'}; see its output above`);
  }
  if (extension && !extension.results.some((result) => result.status === 'passed')) {
    problems.push(`CORE-CAP-004 (${extension.label}) passed no test`);
  }
  if (problems.length > 0) lines.push('', 'problems:', ...problems.map((problem) => `  ${problem}`));
  lines.push('', `reports: ${REPORTS}`);
  const clean = failures.length === 0 && problems.length === 0;
  lines.push(clean ? 'conformance: no failure' : `conformance: ${failures.length} failed test(s)${problems.length > 0 ? `, ${problems.length} problem(s)` : ''}`);
  console.log(lines.join('\n'));
  writeFileSync(join(REPORTS, 'summary.txt'), `${lines.join('\n')}\n`);
  return clean;
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<number> {
  const kit = kitFromEnvironment();
  const masterKey = encodeMasterKey(generateMasterKey());
  const databaseName = `keel_conformance_${randomBytes(4).toString('hex')}`;
  const adminUrl = ADMIN_URL;
  const databaseUrl = Object.assign(new URL(ADMIN_URL), { pathname: `/${databaseName}` }).toString();
  const env = keelEnvironment(databaseUrl, masterKey);
  const config = loadConformanceConfig(env);

  const problems: string[] = [];
  const ports = [{ what: 'server.port', host: config.server.host, port: config.server.port }];
  if (config.grpc.port !== undefined && config.grpc.port !== 0) ports.push({ what: 'grpc.port', host: config.grpc.host ?? config.server.host, port: config.grpc.port });
  for (const { what, host, port } of ports) {
    if (!(await portIsFree(host, port))) refuse(`${host}:${port} (${what} of ${CONFIG}) is in use: stop what listens there (another Keel?) and run again`);
  }
  try {
    await lookup(KIT_WEBHOOK_HOST);
  } catch {
    const warning = `${KIT_WEBHOOK_HOST} does not resolve: the kit's push config tests (PUSH-CREATE-001 and the CRUD tests after it) will fail; on a machine without DNS map it for the run: echo '127.0.0.1 ${KIT_WEBHOOK_HOST}' >> /etc/hosts`;
    console.warn(`conformance: ${warning}`);
    problems.push(warning);
  }

  rmSync(REPORTS, { recursive: true, force: true });
  mkdirSync(REPORTS, { recursive: true });
  const header = [`kit: ${describeKit(kit.dir)}`, `server: ${describeKeel()}, ${CONFIG.slice(repoRoot.length)}, ${config.server.publicUrl}`];

  // A data directory of the run's own (the config's dataDir would be shared between runs).
  const dataDir = mkdtempSync(join(tmpdir(), 'keel-conformance-'));
  guard({ kind: 'dir', path: dataDir });
  await withAdmin((client) => client.query(`CREATE DATABASE ${databaseName}`), adminUrl);
  guard({ kind: 'database', name: databaseName, adminUrl });
  const keel = new ManagedChild('keel', process.execPath, [join(repoRoot, 'bin/keel.js'), 'start', '--config', CONFIG], {
    env: { ...env, KEEL_DATA_DIR: dataDir },
  });
  try {
    const host = config.server.host.includes(':') ? `[${config.server.host}]` : config.server.host;
    await waitUntilReady(keel, `http://${host}:${config.server.port}/readyz`, 90_000);
    const publicUrl = config.server.publicUrl.replace(/\/$/, '');
    const served = await servedTransports(`${publicUrl}/.well-known/agent-card.json`);
    console.log(`conformance: Keel is ready at ${publicUrl}; the root card lists ${served.map((name) => TRANSPORT_LABELS[name]).join(', ')}`);

    const extraArgs = (process.env.A2A_TCK_PYTEST_ARGS ?? '').split(/\s+/).filter((arg) => arg !== '');
    const root = await runKit(kit, { label: 'root agent', directory: 'root' }, publicUrl, served, extraArgs);

    let extension: KitRun | null = null;
    const requiring = config.agents.find((agent) => agent.extensions.some((entry) => entry.uri === REQUIRED_EXTENSION && entry.required));
    if (requiring) {
      const sutHost = `${publicUrl}/a2a/${requiring.id}`;
      const extensionServed = await servedTransports(`${sutHost}/.well-known/agent-card.json`);
      extension = await runKit(kit, { label: `agent ${requiring.id}`, directory: requiring.id }, sutHost, extensionServed, ['-k', 'TestCapabilityExtensionRequired']);
    } else {
      problems.push(`no agent of ${CONFIG.slice(repoRoot.length)} requires ${REQUIRED_EXTENSION}: CORE-CAP-004 was not run`);
    }
    return summarize(header, root, extension, problems) ? 0 : 1;
  } finally {
    await keel.stop(20_000);
    writeFileSync(join(REPORTS, 'keel.log'), `${keel.tail(60)}\n`);
    rmSync(dataDir, { recursive: true, force: true });
    unguard({ kind: 'dir', path: dataDir });
    await withAdmin((client) => client.query(`DROP DATABASE IF EXISTS ${databaseName} WITH (FORCE)`), adminUrl).catch((error: Error) =>
      console.error(`conformance: could not drop the database ${databaseName}: ${error.message}`),
    );
    unguard({ kind: 'database', name: databaseName, adminUrl });
  }
}

runBench('conformance', main);
