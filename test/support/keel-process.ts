import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { HarnessStartOptions } from '../../src/cli/cli-support.js';
import { SUITE_WRITE_PATH_ENV } from './suite-write-path.js';

export const REPO_ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const KEEL_BIN = fileURLToPath(new URL('../../bin/keel.js', import.meta.url));
/** `keel` started by the harness (keel-harness-entry.js): the same program, plus what only tests may pass it. */
export const KEEL_HARNESS_ENTRY = fileURLToPath(new URL('./keel-harness-entry.js', import.meta.url));

export type KeelProcess = {
  child: ChildProcess;
  lines: string[];
  /** Resolves with the first JSON log line whose msg matches. */
  waitForLog: (msg: string | RegExp, timeoutMs?: number) => Promise<Record<string, unknown>>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
};

/** Environment for a child Keel without the suite's own KEEL_* settings leaking in. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) if (!key.startsWith('KEEL_') && !key.startsWith('VITEST')) env[key] = value;
  // No readiness delay at shutdown unless a test asks for one: the suite stops many children.
  return { ...env, KEEL_LOG_LEVEL: 'info', KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS: '0', ...SUITE_WRITE_PATH_ENV, ...extra };
}

/**
 * A `keel` child. With `harness` (test push timings), it runs through the harness's entry, which
 * hands them to `keel start` as an argument: no environment variable or flag of `keel` carries them.
 */
export function spawnKeel(args: string[], options: { cwd: string; env: NodeJS.ProcessEnv; harness?: HarnessStartOptions; netns?: string }): KeelProcess {
  const command = options.harness ? [KEEL_HARNESS_ENTRY, JSON.stringify(options.harness), ...args] : [KEEL_BIN, ...args];
  // In a network namespace (a test host): `ip netns exec` enters it and execs node, so the child's
  // pid is node's own (a signal to it reaches Keel).
  const child = options.netns
    ? spawn('ip', ['netns', 'exec', options.netns, process.execPath, ...command], { cwd: options.cwd, env: options.env, stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn(process.execPath, command, { cwd: options.cwd, env: options.env, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  const waiters: Array<{ match: (line: Record<string, unknown>) => boolean; resolve: (line: Record<string, unknown>) => void }> = [];
  const onLine = (line: string) => {
    lines.push(line);
    let parsed: Record<string, unknown> | null = null;
    try {
      parsed = JSON.parse(line) as Record<string, unknown>;
    } catch {
      return;
    }
    for (const waiter of [...waiters]) {
      if (waiter.match(parsed)) {
        waiters.splice(waiters.indexOf(waiter), 1);
        waiter.resolve(parsed);
      }
    }
  };
  let buffered = '';
  const onData = (chunk: Buffer) => {
    buffered += chunk.toString('utf8');
    const parts = buffered.split('\n');
    buffered = parts.pop() ?? '';
    parts.forEach(onLine);
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  return {
    child,
    lines,
    exited,
    waitForLog: (msg, timeoutMs = 60_000) =>
      new Promise((resolve, reject) => {
        const match = (line: Record<string, unknown>) => (typeof msg === 'string' ? line.msg === msg : msg.test(String(line.msg)));
        const timer = setTimeout(() => reject(new Error(`no log "${String(msg)}" within ${timeoutMs} ms:\n${lines.join('\n')}`)), timeoutMs);
        void exited.then(({ code }) => {
          clearTimeout(timer);
          reject(new Error(`keel exited (${code}) before logging "${String(msg)}":\n${lines.join('\n')}`));
        });
        waiters.push({
          match,
          resolve: (line) => {
            clearTimeout(timer);
            resolve(line);
          },
        });
      }),
  };
}

export async function runKeel(args: string[], options: { cwd: string; env: NodeJS.ProcessEnv }): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [KEEL_BIN, ...args], { cwd: options.cwd, env: options.env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  const code = await new Promise<number | null>((resolve) => child.on('exit', (exitCode) => resolve(exitCode)));
  return { code, stdout, stderr };
}
