// The method every benchmark shares, so that a figure can be trusted on a shared, drifting VM:
// - modes that are compared run in interleaved rounds (A B C, A B C, …), never one after another, so each
//   mode sees the same share of the machine's quiet and busy moments; a figure is the median of its rounds,
//   with the min and max beside it;
// - before each mode of each round a short machine-speed probe runs (an sgemm through the native core's BLAS,
//   and a fixed JavaScript loop when the native core is absent) and the load average is read: a VM's speed
//   moves by 2× at similar load averages, so the load alone does not say how fast the machine was;
// - the report (bench/out/<name>-<timestamp>.json) carries the git revision, the machine's description and
//   every round's raw figures, so a reader can recompute any summary.
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, loadavg, totalmem, release } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { nativeAvailable, sgemmGflops } from '../native/addon.ts';

const here = dirname(fileURLToPath(import.meta.url));

export interface Machine {
  cpuModel: string;
  cores: number;
  memoryGiB: number;
  node: string;
  platform: string;
  kernel: string;
}

export function machine(): Machine {
  return {
    cpuModel: cpus()[0]?.model.trim() ?? 'unknown',
    cores: availableParallelism(),
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    kernel: release(),
  };
}

export interface Revision {
  commit: string | null;
  /** Uncommitted changes in tracked files when the benchmark ran: the commit alone does not describe the code. */
  dirty: boolean | null;
}

export function revision(): Revision {
  const git = (args: string[]) => execFileSync('git', args, { cwd: here, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  try {
    return { commit: git(['rev-parse', 'HEAD']), dirty: git(['status', '--porcelain', '--untracked-files=no']).length > 0 };
  } catch {
    return { commit: null, dirty: null };
  }
}

export interface Probe {
  at: string;
  /** Load average (1, 5, 15 min) just before the probe. */
  load: number[];
  /** GFLOP/s of a 1024×1024 sgemm on every core (the native core's BLAS); null without the native core. */
  sgemmGflops: number | null;
  /** Milliseconds of a fixed single-thread JavaScript loop: the speed of one core as Node sees it. */
  jsLoopMs: number;
}

const round2 = (x: number) => Math.round(x * 100) / 100;

function jsLoop(): number {
  const t0 = performance.now();
  let x = 0;
  for (let i = 0; i < 5_000_000; i++) x = (x + i * 2654435761) % 1000003;
  const ms = performance.now() - t0;
  if (x < 0) throw new Error('unreachable'); // keeps the loop from being optimised away
  return ms;
}

/** A short (~0.1–0.5 s) measurement of how fast this machine is right now. */
export function probe(): Probe {
  const load = loadavg().map(round2);
  let gflops: number | null = null;
  if (nativeAvailable()) {
    try {
      gflops = round2(sgemmGflops(1024, 3, availableParallelism()));
    } catch {
      gflops = null;
    }
  }
  return { at: new Date().toISOString(), load, sgemmGflops: gflops, jsLoopMs: round2(jsLoop()) };
}

export interface Stats {
  n: number;
  median: number;
  min: number;
  max: number;
}

export function stats(xs: number[]): Stats {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return { n: 0, median: NaN, min: NaN, max: NaN };
  const m = s.length >> 1;
  return { n: s.length, median: s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2, min: s[0]!, max: s[s.length - 1]! };
}

export const fmtStats = (s: Stats, digits = 1, unit = '') => (s.n === 0 ? '-' : `${s.median.toFixed(digits)}${unit} [${s.min.toFixed(digits)}–${s.max.toFixed(digits)}]`);

export interface Mode<T> {
  name: string;
  run: (round: number) => Promise<T>;
}

export interface RoundRecord<T> {
  round: number;
  mode: string;
  probe: Probe;
  seconds: number;
  result?: T;
  error?: string;
}

/**
 * Run every mode once per round, in the same order each round, with a probe before each. A failing mode is
 * recorded with its error and the others go on.
 */
export async function interleaved<T>(modes: Mode<T>[], rounds: number, log: (line: string) => void = console.log): Promise<RoundRecord<T>[]> {
  const records: RoundRecord<T>[] = [];
  for (let round = 0; round < rounds; round++) {
    for (const m of modes) {
      const p = probe();
      const t0 = performance.now();
      const rec: RoundRecord<T> = { round, mode: m.name, probe: p, seconds: 0 };
      try {
        rec.result = await m.run(round);
      } catch (err) {
        rec.error = (err as Error).message;
      }
      rec.seconds = round2((performance.now() - t0) / 1000);
      records.push(rec);
      log(`round ${round + 1}/${rounds} ${m.name}: ${rec.error ? `FAILED: ${rec.error.split('\n')[0]}` : `${rec.seconds} s`} (load ${p.load[0]}, sgemm ${p.sgemmGflops ?? '-'} GFLOP/s, JS loop ${p.jsLoopMs} ms)`);
    }
  }
  return records;
}

/** Median/min/max over rounds of one figure of each mode (failed rounds left out). */
export function summarize<T>(records: RoundRecord<T>[], figure: (r: T) => number): Record<string, Stats> {
  const by = new Map<string, number[]>();
  for (const r of records) {
    const xs = by.get(r.mode) ?? [];
    if (r.result !== undefined) xs.push(figure(r.result));
    by.set(r.mode, xs);
  }
  return Object.fromEntries([...by].map(([mode, xs]) => [mode, stats(xs)]));
}

/** Ratio a/b taken round by round (same moment, same load), then median/min/max over rounds. */
export function roundRatios<T>(records: RoundRecord<T>[], a: string, b: string, figure: (r: T) => number): Stats {
  const ratios: number[] = [];
  const rounds = new Set(records.map((r) => r.round));
  for (const round of rounds) {
    const x = records.find((r) => r.round === round && r.mode === a)?.result;
    const y = records.find((r) => r.round === round && r.mode === b)?.result;
    if (x !== undefined && y !== undefined) ratios.push(figure(x) / figure(y));
  }
  return stats(ratios);
}

/** The machine's speed over the run, from every probe: did it move while the modes were measured? */
export function probeSummary(records: { probe: Probe }[]): { sgemmGflops: Stats; jsLoopMs: Stats; load1m: Stats } {
  return {
    sgemmGflops: stats(records.map((r) => r.probe.sgemmGflops ?? NaN)),
    jsLoopMs: stats(records.map((r) => r.probe.jsLoopMs)),
    load1m: stats(records.map((r) => r.probe.load[0]!)),
  };
}


/** Write bench/out/<name>-<timestamp>.json: revision, machine, arguments, probes before and after, the benchmark's own report. */
export function writeReport(name: string, args: string[], startProbe: Probe, report: unknown): string {
  const dir = join(here, 'out');
  mkdirSync(dir, { recursive: true });
  const at = new Date().toISOString();
  const path = join(dir, `${name}-${at.replace(/[:.]/g, '-')}.json`);
  writeFileSync(path, JSON.stringify({ name, args, at, revision: revision(), machine: machine(), probeAtStart: startProbe, probeAtEnd: probe(), report }, null, 2) + '\n');
  return path;
}
