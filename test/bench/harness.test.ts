// The benchmark harness: modes run interleaved (A B, A B, …) with a probe before each, a failing mode does not
// stop the others, summaries are medians with their range, ratios are taken within a round, and the report
// carries the revision and the machine.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync } from 'node:fs';
import { interleaved, probe, roundRatios, stats, summarize, writeReport } from '../../bench/harness.ts';

test('stats: median of odd and even counts, min and max, non-finite values left out', () => {
  assert.deepEqual(stats([3, 1, 2]), { n: 3, median: 2, min: 1, max: 3 });
  assert.deepEqual(stats([4, 1, 3, 2, NaN]), { n: 4, median: 2.5, min: 1, max: 4 });
  assert.equal(stats([]).n, 0);
});

test('interleaved: every round runs each mode in order, with a probe, and a failure is recorded, not thrown', async () => {
  const order: string[] = [];
  const recs = await interleaved(
    [
      { name: 'a', run: async (round) => (order.push(`a${round}`), 10 + round) },
      {
        name: 'b',
        run: async (round) => {
          order.push(`b${round}`);
          if (round === 1) throw new Error('boom');
          return 5;
        },
      },
    ],
    3,
    () => {},
  );
  assert.deepEqual(order, ['a0', 'b0', 'a1', 'b1', 'a2', 'b2']);
  assert.equal(recs.length, 6);
  for (const r of recs) {
    assert.equal(r.probe.load.length, 3);
    assert.ok(r.probe.jsLoopMs > 0);
  }
  assert.equal(recs.find((r) => r.round === 1 && r.mode === 'b')!.error, 'boom');
  const s = summarize(recs, (x) => x);
  assert.deepEqual(s['a'], { n: 3, median: 11, min: 10, max: 12 });
  assert.deepEqual(s['b'], { n: 2, median: 5, min: 5, max: 5 });
  // Round 1 has no b: its ratio is left out rather than paired with another round's figure.
  assert.deepEqual(roundRatios(recs, 'a', 'b', (x) => x), { n: 2, median: 2.2, min: 2, max: 2.4 });
});

test('writeReport: revision, machine and both probes around the report', () => {
  const path = writeReport('harness-test', ['--quick'], probe(), { ok: true });
  try {
    const r = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
    assert.match(path, /bench\/out\/harness-test-\d{4}-\d\d-\d\dT[\d-]+Z\.json$/);
    assert.match((r['revision'] as { commit: string }).commit, /^[0-9a-f]{40}$/);
    const m = r['machine'] as { cores: number; node: string; cpuModel: string };
    assert.ok(m.cores >= 1);
    assert.equal(m.node, process.version);
    assert.ok(m.cpuModel.length > 0);
    assert.ok(r['probeAtStart'] && r['probeAtEnd']);
    assert.deepEqual(r['report'], { ok: true });
    assert.deepEqual(r['args'], ['--quick']);
  } finally {
    rmSync(path, { force: true });
  }
});
