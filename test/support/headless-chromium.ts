import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';

// Debian's Chromium, headless, for the browser tests (playwright-core downloads no browser): a new
// empty profile each time, and the flags that keep it off the network this machine does not have.

const CHROMIUM = '/usr/bin/chromium';

export type HeadlessChromium = { context: BrowserContext; page: Page; close: () => Promise<void> };

export async function launchHeadlessChromium(): Promise<HeadlessChromium> {
  const profile = mkdtempSync(join(tmpdir(), 'keel-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1360, height: 900 },
  });
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(20_000);
  return {
    context,
    page,
    close: async () => {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
