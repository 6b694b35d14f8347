// What the dashboard's browser tests share: a real headless chromium (the test is skipped where none is
// installed, and fails instead under RLSTREAM_REQUIRE_SERVICES=1), polling a page until a condition holds, and
// screenshots in test/artifacts/.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import type { TestContext } from 'node:test';
import { chromium, type Browser, type Page } from 'playwright-core';

const CHROMIUM = process.env['CHROMIUM_PATH'] ?? '/usr/bin/chromium';
const ARTIFACTS = new URL('../artifacts/', import.meta.url);

/** Whether chromium is installed; where it is not, the test is marked skipped (the caller returns). */
export function chromiumAvailable(t: TestContext): boolean {
  if (existsSync(CHROMIUM)) return true;
  if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') assert.fail(`chromium not found at ${CHROMIUM}`);
  t.skip(`chromium not found at ${CHROMIUM} (apt-get install chromium)`);
  return false;
}

export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
}

/** Polls f every 200 ms until it gives a truthy value, which it returns; throws naming `what` after timeoutMs. */
export async function until<T>(page: Page, what: string, f: () => Promise<T | null | undefined | false>, timeoutMs = 15_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await page.waitForTimeout(200);
  }
}

/** A full-page screenshot into test/artifacts/<name>. */
export async function screenshot(page: Page, name: string): Promise<void> {
  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: new URL(name, ARTIFACTS).pathname, fullPage: true });
}
