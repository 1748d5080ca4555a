import { execFileSync } from 'node:child_process';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import pretty from 'pino-pretty';
import { describe, expect, it } from 'vitest';
import { logOutputFor } from '../../../src/log/logger.js';

// Logs are pretty lines for a person at a terminal and JSON lines everywhere else: the tests and the
// fault suite parse the JSON that child processes write to a pipe.

const root = fileURLToPath(new URL('../../../', import.meta.url));

describe('the log output', () => {
  it('is JSON unless stdout is a terminal', () => {
    expect(logOutputFor(false)).toEqual({ format: 'json' });
    expect(logOutputFor(undefined)).toEqual({ format: 'json' });
    expect(logOutputFor(true).format).toBe('pretty');
  });

  it('at a terminal, is one readable line per entry that names the notice level', async () => {
    const output = logOutputFor(true);
    if (output.format !== 'pretty') throw new Error('expected pretty output');
    let text = '';
    const sink = new Writable({
      write(chunk: Buffer, _encoding, done) {
        text += chunk.toString('utf8');
        done();
      },
    });
    const stream = pretty({ ...output.options, colorize: false, destination: sink });
    const logger = pino<'notice'>({ customLevels: { notice: 35 }, base: { service: 'keel' } }, stream);
    logger.notice({ runId: 'r-1' }, 'late settle refused');
    logger.info('keel is ready');
    await new Promise((resolve) => setImmediate(resolve));
    const lines = text.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^\[\d\d:\d\d:\d\d\.\d\d\d\] NOTICE: late settle refused$/);
    expect(lines[1]).toBe('    runId: "r-1"');
    expect(lines[2]).toMatch(/^\[\d\d:\d\d:\d\d\.\d\d\d\] INFO: keel is ready$/);
    expect(text).not.toContain('{"level"');
  });

  it('written by a child process to a pipe, is JSON lines', () => {
    const program = `import { createLogger } from './src/log/logger.ts'; createLogger().notice({ runId: 'r-1' }, 'late settle refused');`;
    const stdout = execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', program], { cwd: root, encoding: 'utf8', env: { ...process.env, KEEL_LOG_LEVEL: 'info' } });
    const entry = JSON.parse(stdout.trim()) as Record<string, unknown>;
    expect(entry).toMatchObject({ level: 35, service: 'keel', runId: 'r-1', msg: 'late settle refused' });
  });

  // pino-pretty is loaded only for a terminal (createLogger's prettyStream): the child runs under a
  // pseudo-terminal (util-linux's `script`), where its stdout is a TTY.
  it('written by a child process to a terminal, is pretty lines', () => {
    const program = `import { createLogger } from './src/log/logger.ts'; createLogger().notice({ runId: 'r-1' }, 'late settle refused');`;
    const command = [process.execPath, '--import', 'tsx', '--input-type=module', '-e', JSON.stringify(program)].join(' ');
    const stdout = execFileSync('script', ['-qfec', command, '/dev/null'], { cwd: root, encoding: 'utf8', env: { ...process.env, KEEL_LOG_LEVEL: 'info', NO_COLOR: '1' } });
    expect(stdout).toMatch(/NOTICE.*late settle refused/);
    expect(stdout).toContain('runId: "r-1"');
    expect(stdout).not.toContain('{"level"');
  });
});
