import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../../src/config/load-config.js';
import { ActiveRunCounts, FRESH_MS } from '../../../src/limits/active-run-counts.js';
import { limitExceeded } from '../../../src/a2a/client-limit-error.js';
import { ClientLimits, type LimitKind } from '../../../src/limits/client-limits.js';
import { TokenBucket } from '../../../src/limits/token-bucket.js';

// The per-client limits' core on a clock of the test's own: the token bucket, the slots, the
// active-run counts between refreshes, and the `limits:` config's validation.

const limitsConfig = (clients: Record<string, object> = {}, defaults: object = {}) => {
  const loaded = loadConfig({ configPath: undefined, cwd: '/', env: { KEEL_LIMITS_CLIENTS: JSON.stringify(clients), ...Object.fromEntries(Object.entries(defaults).map(([key, value]) => [key, String(value)])) } });
  if (!loaded.ok) throw new Error(loaded.problems.join('\n'));
  return loaded.config.limits;
};

describe('TokenBucket', () => {
  it('lets a burst through, then one request per 1/rate seconds, and says how long until the next token', () => {
    const bucket = new TokenBucket(2, 3, 0);
    expect([bucket.take(0), bucket.take(0), bucket.take(0)].every((take) => take.ok)).toBe(true);
    expect(bucket.take(0)).toEqual({ ok: false, waitSeconds: 0.5 });
    expect(bucket.take(250)).toEqual({ ok: false, waitSeconds: 0.25 });
    // A refusal takes nothing: after the wait it names, the request passes.
    expect(bucket.take(500)).toEqual({ ok: true });
    expect(bucket.take(500).ok).toBe(false);
    // Refills up to the burst, no further.
    expect(bucket.full(10_000)).toBe(true);
    expect([0, 1, 2, 3].map(() => bucket.take(10_000).ok)).toEqual([true, true, true, false]);
  });
});

describe('ClientLimits', () => {
  const client = { id: 'c1', name: 'tight' };
  const other = { id: 'c2', name: 'other' };

  it('takes a client’s limits from its name over the default, any subset', () => {
    const limits = new ClientLimits(limitsConfig({ tight: { requestsPerSecond: 1, openStreams: 2 } }), { refuse: limitExceeded, runs: null });
    expect(limits.limitsFor('tight')).toEqual({ requestsPerSecond: 1, burst: 5000, concurrentRequests: 256, openStreams: 2, concurrentRuns: 5000 });
    expect(limits.limitsFor('other')).toEqual({ requestsPerSecond: 5000, burst: 5000, concurrentRequests: 256, openStreams: 200, concurrentRuns: 5000 });
    // Names are own keys only.
    expect(limits.limitsFor('constructor')).toEqual(limits.limitsFor('other'));
  });

  it('refuses past the rate with the wait it names, per client, and counts each refusal by kind', () => {
    let now = 0;
    const refused: LimitKind[] = [];
    const limits = new ClientLimits(limitsConfig({ tight: { requestsPerSecond: 0.5, burst: 2 } }), { refuse: limitExceeded, runs: null, now: () => now, onRefused: (kind) => refused.push(kind) });
    for (let index = 0; index < 2; index += 1) {
      const admitted = limits.admitRequest(client);
      expect(admitted.ok).toBe(true);
      if (admitted.ok) admitted.admission.release();
    }
    const third = limits.admitRequest(client);
    expect(third.ok).toBe(false);
    if (third.ok) return;
    expect(third.error).toMatchObject({
      code: -32029,
      reason: 'CLIENT_LIMIT_EXCEEDED',
      httpStatus: 429,
      status: 'RESOURCE_EXHAUSTED',
      message: 'client limit requestsPerSecond reached: at most 0.5 requests per second (burst 2); retry after 2 s',
      metadata: { limit: 'requestsPerSecond', limitValue: '0.5', burst: '2', retryAfterSeconds: '2' },
      retryAfterSeconds: 2,
    });
    // Another client is not touched.
    expect(limits.admitRequest(other).ok).toBe(true);
    now += 1_999;
    expect(limits.admitRequest(client).ok).toBe(false);
    now += 1;
    expect(limits.admitRequest(client).ok).toBe(true);
    expect(refused).toEqual(['requestsPerSecond', 'requestsPerSecond']);
  });

  it('holds a request slot until release, a stream slot instead once the request streams, and frees both once', () => {
    const limits = new ClientLimits(limitsConfig({ tight: { concurrentRequests: 1, openStreams: 1 } }), { refuse: limitExceeded, runs: null });
    const first = limits.admitRequest(client);
    if (!first.ok) throw new Error('first');
    const second = limits.admitRequest(client);
    expect(!second.ok && second.error.metadata).toEqual({ limit: 'concurrentRequests', limitValue: '1', retryAfterSeconds: '1' });
    const stream = first.admission.openStream();
    if (!stream.ok) throw new Error('stream');
    // The stream gave its request slot back: a request passes, its stream does not.
    const third = limits.admitRequest(client);
    if (!third.ok) throw new Error('third');
    const refusedStream = third.admission.openStream();
    expect(!refusedStream.ok && refusedStream.error.message).toBe('client limit openStreams reached: at most 1 open streams at once; retry after 1 s');
    third.admission.release();
    third.admission.release();
    first.admission.release();
    stream.close();
    stream.close();
    const fourth = limits.admitRequest(client);
    if (!fourth.ok) throw new Error('fourth');
    expect(fourth.admission.openStream().ok).toBe(true);
    expect(limits.admitRequest(client).ok).toBe(true);
  });

  it('forgets a client with nothing in flight and a full bucket', () => {
    let now = 0;
    const limits = new ClientLimits(limitsConfig({ tight: { requestsPerSecond: 1, burst: 1 } }), { refuse: limitExceeded, runs: null, now: () => now });
    const admitted = limits.admitRequest(client);
    limits.prune();
    expect(limits.trackedClients).toBe(1);
    if (admitted.ok) admitted.admission.release();
    limits.prune();
    expect(limits.trackedClients).toBe(1);
    now += 1_000;
    limits.prune();
    expect(limits.trackedClients).toBe(0);
  });
});

describe('concurrent runs', () => {
  function setup(limit: number) {
    let now = 0;
    let database = new Map<string, number>();
    let reads = 0;
    const runs = new ActiveRunCounts(
      async () => {
        reads += 1;
        return new Map(database);
      },
      () => now,
    );
    const limits = new ClientLimits(limitsConfig({ tight: { concurrentRuns: limit } }), { refuse: limitExceeded, runs, now: () => now });
    const admitted = limits.admitRequest({ id: 'c1', name: 'tight' });
    if (!admitted.ok) throw new Error('admit');
    return {
      limits,
      runs,
      start: () => limits.startRun('c1', async () => 'task'),
      setDatabase: (counts: Record<string, number>) => (database = new Map(Object.entries(counts))),
      advance: (ms: number) => (now += ms),
      reads: () => reads,
    };
  }

  it('counts accepted tasks without reading below the limit, and reads again at the limit before refusing', async () => {
    const t = setup(2);
    await t.runs.refresh();
    const before = t.reads();
    expect((await t.start()).ok).toBe(true);
    t.setDatabase({ c1: 1 });
    expect((await t.start()).ok).toBe(true);
    t.setDatabase({ c1: 2 });
    expect(t.reads()).toBe(before);
    // At the limit on a fresh count: refused without a read.
    const refused = await t.start();
    expect(!refused.ok && refused.error.metadata).toEqual({ limit: 'concurrentRuns', limitValue: '2', retryAfterSeconds: '1' });
    expect(t.reads()).toBe(before);
    // One ended (another process's worker): once the count is stale, it is read again, then the task passes.
    t.setDatabase({ c1: 1 });
    t.advance(FRESH_MS + 1);
    expect((await t.start()).ok).toBe(true);
    expect(t.reads()).toBe(before + 1);
  });

  it('frees a run at once when its blocking request saw it end, and gives back a task that was not written', async () => {
    const t = setup(1);
    await t.runs.refresh();
    expect((await t.start()).ok).toBe(true);
    expect((await t.start()).ok).toBe(false);
    t.limits.runEnded('c1');
    expect((await t.start()).ok).toBe(true);
    t.limits.runEnded('c1');
    await expect(t.limits.startRun('c1', async () => Promise.reject(new Error('write failed')))).rejects.toThrow('write failed');
    expect(t.runs.count('c1')).toBe(0);
  });

  it('reads again before refusing a client whose task was committed while a refresh read (it may be counted twice)', async () => {
    const now = 0;
    let database = new Map<string, number>();
    let release: () => void = () => undefined;
    let gate: Promise<void> = Promise.resolve();
    let reads = 0;
    const runs = new ActiveRunCounts(
      async () => {
        reads += 1;
        await gate;
        return new Map(database);
      },
      () => now,
    );
    const limits = new ClientLimits(limitsConfig({ tight: { concurrentRuns: 1 } }), { refuse: limitExceeded, runs, now: () => now });
    if (!limits.admitRequest({ id: 'c1', name: 'tight' }).ok) throw new Error('admit');
    await runs.refresh();
    // A refresh reads while a blocking task is committed; its snapshot sees the task (active then).
    gate = new Promise<void>((resolve) => (release = resolve));
    const refreshing = runs.refresh();
    expect((await limits.startRun('c1', async () => 'first')).ok).toBe(true);
    database = new Map([['c1', 1]]);
    release();
    await refreshing;
    // The task ends and its blocking answer says so; the database agrees.
    limits.runEnded('c1');
    database = new Map();
    expect(runs.count('c1')).toBe(1);
    expect(runs.exactFor('c1')).toBe(false);
    // Counted twice on a fresh count: read again, not refused.
    const before = reads;
    expect((await limits.startRun('c1', async () => 'next')).ok).toBe(true);
    expect(reads).toBe(before + 1);
    expect(runs.exactFor('c1')).toBe(true);
  });

  it('drops the tasks a refresh has seen, keeps those committed after it began', async () => {
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const runs = new ActiveRunCounts(async () => {
      await gate;
      return new Map([['c1', 1]]);
    });
    runs.reserve('c1')(true);
    const refreshing = runs.refresh();
    // Committed while the refresh is in flight: maybe in its snapshot, so kept (counted twice at most).
    runs.reserve('c1')(true);
    const pending = runs.reserve('c1');
    expect(runs.count('c1')).toBe(3);
    release();
    await refreshing;
    expect(runs.count('c1')).toBe(3);
    pending(false);
    expect(runs.count('c1')).toBe(2);
  });
});

describe('the limits: config', () => {
  it('reports each wrong value by its key path', () => {
    const loaded = loadConfig({
      configPath: undefined,
      cwd: '/',
      env: {
        KEEL_LIMITS_DEFAULT_REQUESTS_PER_SECOND: '0',
        KEEL_LIMITS_DEFAULT_BURST: '1.5',
        KEEL_LIMITS_CLIENTS: JSON.stringify({ 'bad name!': {}, ok: { openStreams: 0, surplus: 1 } }),
      },
    });
    expect(loaded.ok).toBe(false);
    if (loaded.ok) return;
    const text = loaded.problems.join('\n');
    expect(text).toContain('limits.default.requestsPerSecond: must be above 0');
    expect(text).toContain('limits.default.burst: expected integer, received float');
    expect(text).toMatch(/limits\.clients\.bad name!.*a client name is 1 to 64 characters/);
    expect(text).toContain('limits.clients.ok.openStreams: must be at least 1');
    expect(text).toMatch(/limits\.clients\.ok.*surplus/);
  });

  it('takes the defaults from the environment', () => {
    expect(limitsConfig({}, { KEEL_LIMITS_DEFAULT_OPEN_STREAMS: 7, KEEL_LIMITS_DEFAULT_REQUESTS_PER_SECOND: 2.5 }).default).toMatchObject({ openStreams: 7, requestsPerSecond: 2.5 });
  });
});
