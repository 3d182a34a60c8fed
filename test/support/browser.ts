/**
 * A real browser for the web console's tests (issue 18): Debian's Chromium, headless, driven by playwright-core
 * (no browser of Playwright's own is downloaded). A file that needs it says so where vitest collects it:
 *
 *   describe.skipIf(missing('chromium'))('the console', () => { ... const browser = await openBrowser(); ... });
 *
 * Every page a test opens records what would go wrong unseen in a person's browser: errors on the page's console,
 * exceptions nothing caught, requests that failed, and answers of the bridge of 500 or more; the test asserts that
 * there were none besides those it expects (`expectClean`). Screenshots go to test-output/console/<folder>/ under the
 * checkout (gitignored), which is printed once, so that a reviewer can look at the pages.
 */
import { mkdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { type Browser, type BrowserContext, type Page, chromium } from 'playwright-core';
import { expect } from 'vitest';
import { ROOT } from './agent.js';
import { CHROMIUM } from './system.js';

/** Where the screenshots of the console's tests go, a folder per test file. */
export const SCREENSHOTS = join(ROOT, 'test-output', 'console');

export interface TestBrowser {
  browser: Browser;
  /** A new page in a context of its own (its own cookies), `width` px wide (default 1280). */
  page(opts?: { width?: number; height?: number }): Promise<ConsolePage>;
  close(): Promise<void>;
}

/** A page, and what went wrong on it. */
export interface ConsolePage {
  page: Page;
  context: BrowserContext;
  /** Each problem as one line: `console error: …`, `page error: …`, `request failed: …`, `answer 5xx: …`. */
  problems: string[];
  /** No problem recorded other than those matching one of `allowed`; then forgets them. */
  expectClean(...allowed: RegExp[]): void;
  close(): Promise<void>;
}

/** Debian's Chromium, headless; without the network features that would reach hosts outside the test. */
export async function openBrowser(): Promise<TestBrowser> {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  return {
    browser,
    async page(opts = {}) {
      const context = await browser.newContext({
        viewport: { width: opts.width ?? 1280, height: opts.height ?? 800 },
      });
      const page = await context.newPage();
      // A step that waits for what never comes fails within the test's own time (Playwright's default is 30 s).
      page.setDefaultTimeout(10_000);
      const problems: string[] = [];
      page.on('console', (m) => {
        if (m.type() === 'error') problems.push(`console error: ${m.text()} (${m.location().url})`);
      });
      page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
      page.on('requestfailed', (r) => {
        // A request the page itself dropped (a navigation, a page closed) is no failure of the bridge.
        const failure = r.failure()?.errorText ?? '';
        if (failure !== 'net::ERR_ABORTED') problems.push(`request failed: ${r.method()} ${r.url()} ${failure}`);
      });
      page.on('response', (r) => {
        if (r.status() >= 500) problems.push(`answer ${r.status()}: ${r.request().method()} ${r.url()}`);
      });
      return {
        page,
        context,
        problems,
        expectClean(...allowed) {
          const unexpected = problems.filter((p) => !allowed.some((a) => a.test(p)));
          problems.length = 0;
          expect(unexpected, 'problems on the page').toEqual([]);
        },
        close: () => context.close(),
      };
    },
    close: () => browser.close(),
  };
}

const announced = new Set<string>();

/**
 * Screenshots into test-output/console/`folder`: `shoot(page, 'devices')` writes devices.png there (the whole
 * page). The folder is made, and printed, at the first shot.
 */
export function screenshots(folder: string): (page: Page, name: string) => Promise<string> {
  const dir = join(SCREENSHOTS, folder);
  return async (page, name) => {
    if (!announced.has(dir)) {
      mkdirSync(dir, { recursive: true });
      process.stderr.write(`screenshots of the console: ${relative(process.cwd(), dir) || dir}\n`);
      announced.add(dir);
    }
    const path = join(dir, `${name}.png`);
    await page.screenshot({ path, fullPage: true });
    return path;
  };
}
