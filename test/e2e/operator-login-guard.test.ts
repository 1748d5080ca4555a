import { sql } from 'slonik';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAdminToken } from '../../src/ui/admin-auth.js';
import { capturingLogger } from '../integration/push/push-support.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';

// The operator login under attack (issue 40): a burst of wrong tokens from one address gets 429
// with Retry-After once the window's limit is spent, the log gains one line per window rather than
// one per attempt, and the right token works again once the window ends. A login's `next` is
// either a safe path under /ui or the default, never a 5xx, never off the UI, and no session row
// is written for an answer that is not a successful login.

// Long enough for a 200-request burst to land in one window on a loaded machine (checked below).
const WINDOW_SECONDS = 4;
const MAX_FAILURES = 5;
const captured = capturingLogger();
let keel: TestKeel;
let token = '';

beforeAll(async () => {
  keel = await startTestKeel({
    overrides: { KEEL_SECURITY_OPERATOR_LOGIN_MAX_FAILURES: String(MAX_FAILURES), KEEL_SECURITY_OPERATOR_LOGIN_WINDOW_SECONDS: String(WINDOW_SECONDS) },
    logger: captured.logger,
  });
  token = (await createAdminToken(keel.context.pool, 'guard')).token;
});
afterAll(async () => keel?.dispose());

const login = (form: Record<string, string>) => fetch(`${keel.url}/ui/login`, { method: 'POST', body: new URLSearchParams(form), redirect: 'manual' });
const sessionRows = () => keel.context.pool.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM admin_sessions`);
const refusalLines = () => captured.text().split('\n').filter((line) => line.includes('operator login refused')).length;
const wrong = `keel_admin_${'B'.repeat(43)}`;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('a burst of wrong tokens', () => {
  it('gets 429 with Retry-After past the limit, one log line per window, and the right token works after the window', async () => {
    const rowsBefore = await sessionRows();
    const linesBefore = refusalLines();
    // 200 wrong tokens at once: only the window's limit is even checked.
    const startedAt = Date.now();
    const burst = await Promise.all(Array.from({ length: 200 }, () => login({ token: wrong, next: '/ui/runs' })));
    expect(Date.now() - startedAt, 'the burst fits in one window').toBeLessThan(WINDOW_SECONDS * 1000);
    const statuses = burst.map((response) => response.status);
    expect(statuses.filter((status) => status === 401)).toHaveLength(MAX_FAILURES);
    expect(statuses.filter((status) => status === 429)).toHaveLength(200 - MAX_FAILURES);
    const locked = burst.find((response) => response.status === 429)!;
    expect(Number(locked.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(Number(locked.headers.get('retry-after'))).toBeLessThanOrEqual(Math.ceil(WINDOW_SECONDS));
    expect(locked.headers.get('set-cookie')).toBeNull();
    expect(refusalLines() - linesBefore).toBe(1);
    // Locked out: the right token too gets 429 and opens no session.
    const during = await login({ token, next: '/ui/runs' });
    expect(during.status).toBe(429);
    expect(during.headers.get('set-cookie')).toBeNull();
    expect(await sessionRows()).toBe(rowsBefore);

    await sleep(WINDOW_SECONDS * 1000 + 200);
    // A second window: another burst, one more line.
    const second = await Promise.all(Array.from({ length: 50 }, () => login({ token: wrong, next: '/ui/runs' })));
    expect(second.filter((response) => response.status === 429)).toHaveLength(50 - MAX_FAILURES);
    expect(refusalLines() - linesBefore).toBe(2);

    await sleep(WINDOW_SECONDS * 1000 + 200);
    const after = await login({ token, next: '/ui/runs' });
    expect(after.status).toBe(303);
    expect(after.headers.get('location')).toBe('/ui/runs');
    expect(after.headers.get('set-cookie')).toMatch(/^keel_ui_session=[A-Za-z0-9_-]{43};/);
    expect(await sessionRows()).toBe(rowsBefore + 1);
  });
});

describe("a login's next", () => {
  const cases: Array<[string, string]> = [
    ['/ui/runs?agent=日本', '/ui/runs?agent=%E6%97%A5%E6%9C%AC'],
    ['/ui/runs?agent=%E6%97%A5%E6%9C%AC', '/ui/runs?agent=%E6%97%A5%E6%9C%AC'],
    ['/ui/runs?agent=\u0001', '/ui/runs?agent='],
    ['/ui/runs?agent=a\u0001b', '/ui/runs?agent=a%01b'],
    ['/ui/runs?agent=a\r\nSet-Cookie: evil=1', '/ui/runs?agent=aSet-Cookie:%20evil=1'],
    ['/ui/runs?agent=%0D%0A', '/ui/runs?agent=%0D%0A'],
    ['/ui/r\u00e9sum\u00e9', '/ui/r%C3%A9sum%C3%A9'],
    ['https://evil.example/', '/ui/machines'],
    ['//evil.example/ui', '/ui/machines'],
    ['/\\evil.example/ui', '/ui/machines'],
    ['/ui\\..\\..\\evil', '/ui/machines'],
    ['javascript:alert(1)', '/ui/machines'],
    ['/ui/../admin', '/ui/machines'],
    ['/uix', '/ui/machines'],
    ['', '/ui/machines'],
  ];

  it.each(cases)('%j is sent as %j, never a 5xx, and only a sent cookie has a session row', async (next, location) => {
    const rowsBefore = await sessionRows();
    const response = await login({ token, next });
    expect(response.status).toBe(303);
    expect(response.headers.get('location')).toBe(location);
    expect(new URL(response.headers.get('location')!, keel.url).origin).toBe(new URL(keel.url).origin);
    expect(new URL(response.headers.get('location')!, keel.url).pathname).toMatch(/^\/ui(\/|$)/);
    expect(response.headers.get('set-cookie')).toMatch(/^keel_ui_session=/);
    expect(await sessionRows()).toBe(rowsBefore + 1);
    // The login form carries it too without failing.
    const form = await fetch(`${keel.url}/ui/login?next=${encodeURIComponent(next)}`);
    expect(form.status).toBe(200);
  });

  it('a refused login writes no session row, whatever its next', async () => {
    const rowsBefore = await sessionRows();
    for (const [next] of cases.slice(0, 4)) expect([401, 429]).toContain((await login({ token: wrong, next })).status);
    expect(await sessionRows()).toBe(rowsBefore);
  });
});
