// The trace benchmark's smoke size (bench/traces.ts --quick) on chDB: every mode (the store path, the sink's
// drain from the embedded log, the engine alone) runs in the harness's rounds with a probe before each, the drain
// reads every record of the log through the native transcoders, and every rate is finite and positive.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { main, type PhaseResult } from '../../bench/traces.ts';

test('traces --quick on chDB: each mode once a round, every figure finite and positive', { timeout: 90_000 }, async () => {
  const report = (await main(['--quick', '--targets', 'chdb', '--kafka-sink', 'false'])) as {
    options: { rounds: number };
    sinkLog: { records: number; turns: number };
    summary: { rowsPerSecond: Record<string, { n: number; median: number; min: number }>; cpuUsPerRow: Record<string, { n: number; median: number }> };
    rounds: { round: number; mode: string; probe: { load: number[]; jsLoopMs: number }; result?: PhaseResult; error?: string }[];
  };
  const modes = ['chdb store path', 'chdb sink, embedded log', 'chdb engine alone'];
  assert.deepEqual(
    report.rounds.map((r) => r.mode),
    modes,
  );
  for (const r of report.rounds) {
    assert.equal(r.error, undefined, r.mode);
    assert.ok(r.probe.jsLoopMs > 0 && r.probe.load.length === 3);
    const x = r.result!;
    assert.ok(x.rows > 0 && x.seconds > 0 && x.rowsPerSecond > 0 && Number.isFinite(x.rowsPerSecond), `${r.mode}: ${JSON.stringify(x)}`);
    if ('records' in x) {
      assert.equal(x.records, report.sinkLog.records, 'a drain reads every record of the log');
      assert.equal(x.transcoded > 0, x.path === 'native transcoders', `${r.mode}: transcoded ${x.transcoded}`);
    }
  }
  for (const m of modes) {
    assert.equal(report.summary.rowsPerSecond[m]!.n, report.options.rounds, m);
    assert.ok(report.summary.rowsPerSecond[m]!.min > 0 && Number.isFinite(report.summary.cpuUsPerRow[m]!.median), m);
  }
});
