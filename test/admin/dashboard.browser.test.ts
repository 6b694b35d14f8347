// The dashboard in a real headless chromium against a running server and a live (synthetic) run: the charts
// draw from live data and change as steps arrive, held-out accuracy is a dot per evaluation at its version's
// step with the latest result in words, a run without readers shows no lag (not partition sizes), the tool-call
// table fills, a trajectory opens with tokens coloured by loss mask, tool results inline and whether it was
// trained, and nothing is fetched from another origin.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startAdminServer } from '../../admin/server.ts';
import { chromiumAvailable, launchChromium, screenshot, until } from './browser.ts';
import { fixture, READ_TOKEN, TOKENS } from './helpers.ts';
import { syntheticRun } from './synthetic-run.ts';

test('dashboard draws live charts and opens a trajectory', { timeout: 300_000 }, async (t) => {
  if (!chromiumAvailable(t)) return;
  const f = await fixture({ traces: true });
  const run = await syntheticRun({ log: f.log, serde: f.serde, traces: f.store! });
  f.runs.add({ id: run.runId, config: { model: 'synthetic' }, stalenessBound: 2 });
  for (let i = 0; i < 4; i++) await run.step();
  const server = await startAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: { pollTimeoutMs: 100 } });
  const browser = await launchChromium();
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 1400 } });
    const foreign: string[] = [];
    page.on('request', (r) => {
      if (!r.url().startsWith(server.url)) foreign.push(r.url());
    });
    const pageErrors: string[] = [];
    page.on('pageerror', (e) => pageErrors.push(e.message));

    await page.goto(`${server.url}/dashboard/#token=${READ_TOKEN}`);
    // The token moved from the fragment to sessionStorage.
    assert.equal(new URL(page.url()).hash, '');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('rlstream.adminToken')), READ_TOKEN);

    const pathOf = (id: string) => page.$eval(`#${id} path.series`, (p) => ({ d: p.getAttribute('d') ?? '', n: Number(p.getAttribute('data-points')) })).catch(() => null);
    const first = await until(page, 'reward curve', async () => {
      const p = await pathOf('chart-reward');
      return p && p.n >= 4 ? p : null;
    });
    for (const id of ['chart-heldout', 'chart-kl', 'chart-entropy', 'chart-staleness', 'chart-throughput']) {
      const p = await until(page, `${id} curve`, () => pathOf(id));
      assert.match(p.d, /^M[\d.]+,[\d.]+( L[\d.]+,[\d.]+)+$/, `${id} has a drawn path`);
    }
    // Held-out accuracy: one dot per evaluation (v0 at step 0, v1 at step 1, v2 at step 3), at the share solved;
    // step 2 was not evaluated and has no dot.
    const dots = (await page.$$eval('#chart-heldout circle.point', (cs) => cs.map((c) => [Number(c.getAttribute('data-x')), Number(c.getAttribute('data-y'))]))) as number[][];
    assert.deepEqual(dots, run.evaluations.map((e) => [e.step ?? e.policy_version, e.solved / e.n]));
    assert.deepEqual(dots.map((d) => d[0]), [0, 1, 3]);
    assert.equal(await page.textContent('#heldout-result'), 'latest: v2 (step 3) · 10/20 solved = 50.0% · mean reward 0.550 · synthetic/heldout[0:20]');
    // No consumer group of this run reads rollout.events: no bars, and the chart says why.
    await until(page, 'rollout lag note', async () => /no consumer group of run/.test((await page.textContent('#chart-lag')) ?? ''));
    assert.equal(await page.$eval('#chart-lag', (s) => (s as SVGElement).dataset['bars']), '0');

    // New steps arrive: the curves grow and change without a reload.
    run.start(300);
    // A synthetic step writes a few dozen trace rows: on 2 cores shared with other jobs, two take well over 15 s.
    const later = await until(page, 'more points', async () => {
      const p = await pathOf('chart-reward');
      return p && p.n >= first.n + 2 ? p : null;
    }, 90_000);
    await run.stop();
    assert.notEqual(later.d, first.d);
    assert.match(await page.textContent('#run-status') ?? '', /running/);

    // Tool calls table, then a trajectory with tokens coloured by mask and the tool result inline.
    await until(page, 'tool-call rows', async () => (await page.$$('#toolcalls tbody tr')).length > 0);
    await page.click('#toolcalls a.open-trajectory');
    await until(page, 'trajectory tokens', async () => (await page.$$('#trajectory .tok.m1')).length > 0);
    const m1 = await page.$$('#trajectory .tok.m1');
    const m0 = await page.$$('#trajectory .tok.m0');
    assert.ok(m1.length > 0 && m0.length > 0, 'both trained and untrained tokens are shown');
    // A string expression: tsx's transform would wrap an inner arrow function in a helper the page lacks.
    const colours = (await page.evaluate(
      `({ m1: getComputedStyle(document.querySelector('#trajectory .tok.m1')).backgroundColor, m0: getComputedStyle(document.querySelector('#trajectory .tok.m0')).backgroundColor })`,
    )) as { m1: string; m0: string };
    assert.notEqual(colours.m1, colours.m0, 'mask 1 and mask 0 tokens have different colours');
    assert.match((await page.textContent('#trajectory .tool-result')) ?? '', /calculator/);
    assert.match((await page.textContent('#trajectory-training')) ?? '', /^trained at step \d+$/);

    await screenshot(page, 'admin-dashboard.png');
    assert.deepEqual(foreign, [], 'the page fetched nothing from another origin');
    assert.deepEqual(pageErrors, []);
  } finally {
    await browser.close();
    await run.stop();
    await server.close();
    await f.close();
  }
});
