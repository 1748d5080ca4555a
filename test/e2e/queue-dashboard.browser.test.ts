import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminSession, type AdminSession } from '../support/operator-ui.js';
import { startTestKeel, type TestKeel } from '../support/test-keel.js';
import { launchHeadlessChromium, type HeadlessChromium } from '../support/headless-chromium.js';

// The queue dashboard (bull-board at /ui/queues) is served with a Content-Security-Policy like the
// other UI pages and renders from Keel alone: in Chromium every request the page makes goes to
// 127.0.0.1 (bull-board's page links web fonts from a public host; Keel drops the links), and the
// policy blocks nothing the page needs.


let keel: TestKeel;
let session: AdminSession;
let page: Page;
let browser: HeadlessChromium | undefined;

beforeAll(async () => {
  keel = await startTestKeel();
  session = await adminSession(keel, 'dashboard');
  browser = await launchHeadlessChromium();
  ({ page } = browser);
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await keel?.dispose();
});

describe('the queue dashboard', () => {
  it('is served with a Content-Security-Policy and links nothing from another host', async () => {
    const response = await fetch(`${keel.url}/ui/queues`, { headers: { cookie: session.cookie } });
    expect(response.status).toBe(200);
    const policy = response.headers.get('content-security-policy');
    expect(policy).toContain("default-src 'none'");
    expect(policy).toContain("script-src 'self'");
    expect(policy).toContain("connect-src 'self'");
    expect(policy).toContain("frame-ancestors 'none'");
    const html = await response.text();
    expect(html).toContain('<base href="/ui/queues/"');
    expect(html).not.toMatch(/(?:src|href)="(?:https?:)?\/\//);
  });

  it('renders in Chromium with no request leaving 127.0.0.1 and nothing blocked by the policy', async () => {
    const requested: string[] = [];
    const failed: string[] = [];
    const violations: string[] = [];
    page.on('request', (request) => requested.push(request.url()));
    page.on('requestfailed', (request) => failed.push(`${request.url()} ${request.failure()?.errorText ?? ''}`));
    page.on('console', (message) => {
      if (/Content Security Policy|Refused to/i.test(message.text())) violations.push(message.text());
    });
    await page.goto(`${keel.url}/ui/login?next=${encodeURIComponent('/ui/queues')}`);
    await page.fill('input[name="token"]', session.token);
    await Promise.all([page.waitForURL(`${keel.url}/ui/queues`), page.click('button[type="submit"]')]);
    // The dashboard's own app draws the queue list from its API.
    await page.waitForSelector('text=runs', { timeout: 20_000 });
    await page.waitForSelector('text=maintenance');
    await page.waitForTimeout(500);
    expect(requested.length).toBeGreaterThan(3);
    const elsewhere = requested.filter((url) => !/^(data:|blob:)/.test(url) && new URL(url).hostname !== '127.0.0.1');
    expect(elsewhere).toEqual([]);
    expect(violations).toEqual([]);
    expect(failed).toEqual([]);
  });
});
