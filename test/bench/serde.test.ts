// The serde benchmark's smoke size (bench/serde.ts --quick): both sides run in the harness's interleaved rounds
// with a probe before each, every event type gets a finite, positive time on both sides, and a speed-up taken
// within each round.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EVENT_NAMES } from '../../schemas/index.ts';
import { main, type SerdeRow } from '../../bench/serde.ts';

test('serde --quick: every event type timed on both sides in each round, with within-round speed-ups', { timeout: 60_000 }, async () => {
  const report = (await main(['--quick', '--rounds', '2', '--tokens', '200'])) as {
    options: { rounds: number; tokens: number };
    rows: SerdeRow[];
    floors: Record<string, number>;
    rounds: { round: number; mode: string; probe: { load: number[]; jsLoopMs: number }; result?: unknown; error?: string }[];
    machineSpeed: { jsLoopMs: { n: number } };
  };
  assert.deepEqual(report.options.rounds, 2);
  assert.deepEqual(
    report.rounds.map((r) => `${r.round}:${r.mode}`),
    ['0:avsc', '0:EventSerde', '1:avsc', '1:EventSerde'],
  );
  for (const r of report.rounds) {
    assert.equal(r.error, undefined);
    assert.ok(r.probe.jsLoopMs > 0 && r.probe.load.length === 3);
  }
  assert.equal(report.machineSpeed.jsLoopMs.n, 4);
  assert.deepEqual(report.rows.map((r) => r.event).sort(), [...EVENT_NAMES].sort());
  for (const row of report.rows) {
    assert.ok(row.bytes > 0, row.event);
    for (const s of [row.encodeAvscUs, row.encodeOursUs, row.decodeAvscUs, row.decodeOursUs, row.encodeSpeedup, row.decodeSpeedup]) {
      assert.equal(s.n, 2, row.event);
      assert.ok(Number.isFinite(s.median) && s.min > 0 && s.min <= s.median && s.median <= s.max, `${row.event}: ${JSON.stringify(s)}`);
    }
  }
  for (const [k, v] of Object.entries(report.floors)) assert.ok(Number.isFinite(v) && v > 0, k);
});
