import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../../src/config/load-config.js';
import { EventLoopLag } from '../../../src/health/event-loop-lag.js';
import { buildHttpServer } from '../../../src/http/http-server.js';
import { createLogger } from '../../../src/log/logger.js';
import { tempDir } from '../../support/test-keel.js';

// The two pieces /livez and the readiness-first shutdown stand on: the event loop's lag, measured
// by a timer (no database, no queue), and server.shutdownReadyDelaySeconds with its clear errors.

function load(yaml: string, env: NodeJS.ProcessEnv = {}) {
  const dir = tempDir('keel-config-');
  const path = join(dir, 'keel.config.yaml');
  writeFileSync(path, yaml);
  return loadConfig({ configPath: path, env, cwd: dir });
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('the event loop lag', () => {
  it('is small while the loop turns and shows a blocked loop, at once and for a while after', async () => {
    const lag = new EventLoopLag();
    lag.start();
    try {
      await sleep(350);
      expect(lag.lagMs()).toBeLessThan(200);
      const blockedUntil = performance.now() + 400;
      while (performance.now() < blockedUntil) {
        // the loop is held: no timer fires
      }
      expect(lag.lagMs(), 'a loop blocked right now shows at once').toBeGreaterThanOrEqual(250);
      await sleep(250);
      expect(lag.lagMs(), 'and stays in the window').toBeGreaterThanOrEqual(250);
    } finally {
      lag.stop();
    }
    expect(lag.lagMs(), 'stopped: nothing pending').toBeGreaterThanOrEqual(0);
  });
});

describe('server.shutdownReadyDelaySeconds', () => {
  it('defaults to 5 and is set by the file or KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS', () => {
    const byDefault = load('');
    expect(byDefault.ok && byDefault.config.server.shutdownReadyDelaySeconds).toBe(5);
    const fromFile = load('server: { shutdownReadyDelaySeconds: 12.5 }\n');
    expect(fromFile.ok && fromFile.config.server.shutdownReadyDelaySeconds).toBe(12.5);
    const fromEnv = load('', { KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS: '0' });
    expect(fromEnv.ok && fromEnv.config.server.shutdownReadyDelaySeconds).toBe(0);
  });

  it('refuses a bad value with a clear message', () => {
    expect(load('server: { shutdownReadyDelaySeconds: -1 }\n')).toEqual({ ok: false, problems: ['server.shutdownReadyDelaySeconds: expected 0 or more seconds'] });
    expect(load('server: { shutdownReadyDelaySeconds: 301 }\n')).toEqual({ ok: false, problems: ['server.shutdownReadyDelaySeconds: expected at most 300 seconds'] });
    expect(load('server: { shutdownReadyDelaySeconds: soon }\n')).toEqual({ ok: false, problems: ['server.shutdownReadyDelaySeconds: expected number, received string'] });
    expect(load('', { KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS: 'soon' })).toEqual({
      ok: false,
      problems: ['server.shutdownReadyDelaySeconds: expected a number, got "soon" (from KEEL_SERVER_SHUTDOWN_READY_DELAY_SECONDS)'],
    });
  });
});

describe('/livez', () => {
  it('answers from the lag alone (never the readiness probes): 200 within the bound, 503 beyond it', async () => {
    let lagMs = 12;
    let readinessCalls = 0;
    const app = buildHttpServer({
      logger: createLogger({ level: 'silent' }, false),
      bodyLimitBytes: 1_048_576,
      readiness: async () => {
        readinessCalls += 1;
        return { database: { ok: false, reason: 'unreachable' }, queue: { ok: true } };
      },
      liveness: { lagMs: () => lagMs, maxLagMs: 10_000 },
    });
    try {
      for (const url of ['/livez', '/healthz']) {
        const live = await app.inject({ method: 'GET', url });
        expect([live.statusCode, live.json()]).toEqual([200, { status: 'ok' }]);
      }
      lagMs = 12_345;
      const stalled = await app.inject({ method: 'GET', url: '/livez' });
      expect([stalled.statusCode, stalled.json()]).toEqual([503, { status: 'stalled', eventLoopLagMs: 12_345, maxLagMs: 10_000 }]);
      expect(readinessCalls, '/livez reads neither the database nor the queue').toBe(0);
    } finally {
      await app.close();
    }
  });
});
