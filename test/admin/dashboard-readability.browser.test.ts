// What the dashboard says must read right, in a real headless chromium: a run that ended shows "finished"
// (not a green "running"); the KL chart says "KL off" when the trainer keeps no reference model instead of a
// flat line at 0; the rollout-lag chart labels each partition once, uncut, with a legend naming the reading
// roles; token chips show the token's text with the id on hover. Screenshot in test/artifacts/.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { startAdminServer } from '../../admin/server.ts';
import { adminTraceStore } from '../../admin/traces-adapter.ts';
import { TOPICS } from '../../core/topics.ts';
import { chromiumAvailable, launchChromium, screenshot, until } from './browser.ts';
import { fixture, READ_TOKEN, TOKENS } from './helpers.ts';
import { syntheticRun } from './synthetic-run.ts';

test('dashboard: finished badge, "KL off", a labelled lag chart with a legend, token texts with ids on hover', { timeout: 120_000 }, async (t) => {
  if (!chromiumAvailable(t)) return;
  const f = await fixture({ traces: true });
  // The synthetic run's token ids are character codes: its "tokenizer" decodes them so (a test stand-in).
  f.ctx.traces = adminTraceStore(f.store!, undefined, (ids) => ids.map((id) => String.fromCharCode(id)));
  const run = await syntheticRun({ log: f.log, serde: f.serde, traces: f.store!, runId: 'calculator-1-20260101000000' });
  for (let i = 0; i < 4; i++) await run.step();
  await run.stop();
  const group = (role: string) => ({ groupId: `${run.runId}.${role}`, topics: [TOPICS.rolloutEvents] });
  f.runs.add({ id: run.runId, status: 'completed', config: { trainer: { learning_rate: 0.0003 } }, consumerGroups: { reward: group('reward'), traces: group('traces') } });
  const server = await startAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: { pollTimeoutMs: 100 } });
  const browser = await launchChromium();
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 1400 } });
    const pageErrors: string[] = [];
    page.on('pageerror', (e) => pageErrors.push(e.message));
    await page.goto(`${server.url}/dashboard/#token=${READ_TOKEN}`);

    // The badge holds a placeholder (—) until the run's status has loaded.
    const status = async () => ((await page.textContent('#run-status')) || '').trim().replace(/^—$/, '') || null;
    assert.equal(await until(page, 'the status badge', status), 'finished');
    const badge = (await page.evaluate(`getComputedStyle(document.querySelector('#run-status')).backgroundColor`)) as string;
    const green = 'rgb(220, 252, 231)';
    assert.notEqual(badge, green, 'a finished run is not shown in the running colour');

    // KL: the config has no trainer.kl_coef (default 0): the chart says so and draws no line.
    const off = await until(page, 'KL off', () => page.$eval('#chart-kl', (s) => (s as SVGElement).dataset['off'] ?? null).catch(() => null));
    assert.match(off, /^KL off/);
    assert.equal(await page.$('#chart-kl path.series'), null);
    assert.match((await page.textContent('#chart-kl')) ?? '', /KL off/);

    // Lag: 4 partitions × 2 readers; one label per partition, none cut, none overlapping; a legend per role.
    await until(page, 'lag bars', async () => Number(await page.$eval('#chart-lag', (s) => (s as SVGElement).dataset['bars'] ?? '0')) === 8);
    const labels = (await page.evaluate(
      `[...document.querySelectorAll('#chart-lag .bar-label')].map((e) => { const b = e.getBBox(); return { text: e.textContent, x: b.x, w: b.width }; })`,
    )) as { text: string; x: number; w: number }[];
    assert.deepEqual(labels.map((l) => l.text), ['p0', 'p1', 'p2', 'p3']);
    for (let i = 1; i < labels.length; i++) assert.ok(labels[i]!.x > labels[i - 1]!.x + labels[i - 1]!.w, 'labels do not overlap');
    const legend = (await page.$$eval('#chart-lag .legend-entry', (es) => es.map((e) => e.textContent))) as string[];
    assert.deepEqual(legend, ['reward lag', 'traces lag']);
    const fills = (await page.$$eval('#chart-lag rect.bar:not(.high)', (es) => es.map((e) => e.getAttribute('fill')))) as string[];
    assert.equal(new Set(fills).size, 2, 'one colour per reading role');

    // Token chips: text, id on hover.
    await until(page, 'tool-call rows', async () => (await page.$$('#toolcalls tbody tr')).length > 0);
    await page.click('#toolcalls a.open-trajectory');
    await until(page, 'token chips', async () => (await page.$$('#trajectory .tok')).length > 0);
    const chips = (await page.$$eval('#trajectory .tok', (es) => es.slice(0, 40).map((e) => ({ text: e.textContent ?? '', title: e.getAttribute('title') ?? '' })))) as { text: string; title: string }[];
    for (const c of chips) {
      const id = Number(/^id (\d+)/.exec(c.title)?.[1]);
      assert.ok(Number.isInteger(id), `the id is on hover: ${c.title}`);
      const expected = String.fromCharCode(id).replace(/\n/g, '↵');
      assert.equal(c.text, expected.trim() === '' ? '·'.repeat(expected.length) : expected, 'the chip shows the token text');
    }

    await screenshot(page, 'admin-dashboard-readability.png');
    assert.deepEqual(pageErrors, []);
  } finally {
    await browser.close();
    await server.close();
    await f.close();
  }
});
