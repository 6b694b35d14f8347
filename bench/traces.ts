// Trace store benchmark: sink throughput (rows/s, MB/s of insert payload sent: RowBinary since the fast path) through the sink's insert path
// (rowsOf → TraceWriter → TraceStore.insert) over a synthetic run of ≥ 1M turns, then the latency of every
// named query over that run; on chDB and, when CLICKHOUSE_URL is set, on the server.
// Usage: npm run bench -- traces [--turns 1000000] [--tokens 24] [--targets chdb,server]
import { mkdtempSync, rmSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openTraceStore } from '../core/traces/open.ts';
import { listNamedQueries, runNamed } from '../core/traces/queries.ts';
import type { DecodedEvent } from '../core/serde/events.ts';
import { rowsOf } from '../consumers/traces/rows.ts';
import { TraceWriter } from '../consumers/traces/writer.ts';
import { syntheticRun, syntheticTurnCount } from '../test/traces/synthetic.ts';

function arg(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] ? args[i + 1]! : fallback;
}

interface TargetReport {
  target: string;
  dialect: string;
  turns: number;
  rows: number;
  /** Time in the insert path. */
  seconds: number;
  /** Including generation of the synthetic events. */
  totalSeconds: number;
  rowsPerSecond: number;
  mbPerSecond: number;
  queries: { name: string; rows: number; medianMs: number; maxMs: number }[];
}

async function benchTarget(spec: string, turnsWanted: number, tokens: number): Promise<TargetReport> {
  const store = await openTraceStore(spec, { database: `bench_traces_${Date.now().toString(36)}` });
  try {
    const assistantTurns = 4;
    const groupSize = 4;
    const groups = Math.ceil(turnsWanted / (groupSize * (2 * assistantTurns - 1)));
    const run = { runId: 'bench', groups, groupSize, assistantTurns, tokensPerTurn: tokens, trajectoriesPerStep: 256, seed: 3 };
    const writer = new TraceWriter(store, { maxRows: 50_000, maxDelayMs: 60_000 });
    let someTrajectory = '';
    // Only the sink's insert path is timed (serialization + engine); generating the synthetic events is not.
    let insertMs = 0;
    const flush = async () => {
      const s = performance.now();
      await writer.flush();
      insertMs += performance.now() - s;
    };
    const t0 = performance.now();
    for (const ev of syntheticRun(run)) {
      if (!someTrajectory && ev.name === 'TrajectoryStarted') someTrajectory = (ev.value as { trajectory_id: string }).trajectory_id;
      for (const { table, row } of rowsOf({ name: ev.name, value: ev.value, schemaId: 0 } as DecodedEvent)) writer.add(table, row);
      if (writer.pending >= writer.maxRows) await flush();
    }
    await flush();
    const totalSeconds = (performance.now() - t0) / 1000;
    const seconds = insertMs / 1000;
    const rows = writer.stats.rows;
    const queries: TargetReport['queries'] = [];
    for (const q of listNamedQueries()) {
      const params = q.params.some((p) => p.name === 'id') ? { id: someTrajectory, run: 'bench' } : {};
      const times: number[] = [];
      let n = 0;
      for (let i = 0; i < 3; i++) {
        const s = performance.now();
        n = (await runNamed(store, q.name, params)).rows.length;
        times.push(performance.now() - s);
      }
      times.sort((a, b) => a - b);
      queries.push({ name: q.name, rows: n, medianMs: Math.round(times[1]!), maxMs: Math.round(times[2]!) });
    }
    return {
      target: store.kind,
      dialect: store.dialect,
      turns: syntheticTurnCount(run),
      rows,
      seconds: Math.round(seconds * 10) / 10,
      totalSeconds: Math.round(totalSeconds * 10) / 10,
      rowsPerSecond: Math.round(rows / seconds),
      mbPerSecond: Math.round((((store as { bytesSent?: number }).bytesSent ?? 0) / 1e6 / seconds) * 10) / 10,
      queries,
    };
  } finally {
    await store.exec(`DROP DATABASE IF EXISTS ${store.database}`).catch(() => undefined);
    await store.close();
  }
}

export async function main(args: string[]): Promise<TargetReport[]> {
  const turns = Number(arg(args, 'turns', '1000000'));
  const tokens = Number(arg(args, 'tokens', '24'));
  const wanted = arg(args, 'targets', process.env['CLICKHOUSE_URL'] ? 'chdb,server' : 'chdb').split(',');
  const reports: TargetReport[] = [];
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-traces-'));
  try {
    for (const t of wanted) {
      if (t === 'server' && !process.env['CLICKHOUSE_URL']) {
        console.log('server: CLICKHOUSE_URL is not set, skipped');
        continue;
      }
      const spec = t === 'server' ? process.env['CLICKHOUSE_URL']! : `chdb:${dir}`;
      console.log(`${t}: inserting a synthetic run of ${turns} turns (${tokens} tokens each)…`);
      const r = await benchTarget(spec, turns, tokens);
      reports.push(r);
      console.log(`${t} (${r.dialect}): ${r.rows} rows (${r.turns} turns) in ${r.seconds} s of inserts (${r.totalSeconds} s with generation) = ${r.rowsPerSecond} rows/s, ${r.mbPerSecond} MB/s  [target ≥ 200000 rows/s]`);
      console.log('  named query                 rows   median ms   max ms   (target < 1000 ms)');
      for (const q of r.queries) console.log(`  ${q.name.padEnd(34)} ${String(q.rows).padStart(6)} ${String(q.medianMs).padStart(11)} ${String(q.maxMs).padStart(8)}${q.maxMs >= 1000 ? '   OVER' : ''}`);
    }
    console.log(`note: ${os.cpus().length} cores, load average ${os.loadavg()[0]!.toFixed(1)}: timings on a shared machine are noisy.`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return reports;
}
