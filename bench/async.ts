// Asynchronous speed-up: the main job (built-in policy, tool agent, reward, advantage, trainer,
// traces) with a calculator behind a heavy-tailed simulated service delay (examples/calculator/
// tools-heavy-tail.yaml), synchronous (staleness bound 0: the trainer waits for a full batch of one policy
// version, rollouts wait for the update) against asynchronous with staleness bounds 1, 2 and 4 — the same
// steps × groups × n trajectories trained in each. Per mode: wall time of the RL phase, trainer busy fraction
// (its compute time / RL wall time), generated tokens/s, trained trajectories/s, mean staleness, held-out
// accuracy at the end, speed-up against sync. The traces of each run are then checked: in sync every step v
// trained only on trajectories generated wholly by version v, and each version started exactly one batch.
//
// Each mode runs as its own child process (this file with --child) in a fresh data dir, so no JIT, native or
// chDB state carries over from one mode to the next. The modes run in interleaved rounds (sync, 1, 2, 4, sync,
// 1, 2, 4, …; bench/harness.ts) with a machine-speed probe (sgemm, load average) before each: the figures are
// the median [min–max] over rounds, and a speed-up is taken round by round (sync and async of the same round).
// The sync baseline gets its best setting: its trainer runs on every core (--sync-threads, default the core
// count), since nothing else runs while it trains; async modes keep the configured trainer threads
// (--async-threads, default 1), since their rollouts need the other core.
//   npm run bench -- async [--rounds 3] [--steps 20] [--bounds 0,1,2,4] [--groups 8] [--n 8] [--heldout 200]
//                          [--sync-threads N] [--async-threads N] [--tools <tool-config.yaml>] [--keep] [--quick]
//                          [--config <run config>] [--device cpu|cuda]
// --config examples/calculator/config.gpu.yaml --device cuda: the trainer on the GPU, the rollouts on the CPU
// cores (test/gpu/pack-node.sh runs it on a GPU machine). A config without a trace store (traces.kind: none)
// verifies sync from its TrainSteps alone (staleness 0, none dropped, every step full) instead of the traces.
// --quick: 2 steps of 2 groups × 2, bounds 0 and 4, 2 rounds: proves the benchmark runs, its figures mean nothing.
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadRunConfig } from '../cli/config/run-config.ts';
import { openTraceStore } from '../core/traces/open.ts';
import { runMainJob, type MainJobSummary } from '../cli/run/main-job.ts';
import type { TrainStep } from '../schemas/generated/types.ts';
import { benchChildSpec, runBenchChild, writeBenchChildResult } from './child.ts';
import { choice, MAIN_JOB_FLAGS, parseFlags, path, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, roundRatios, summarize, type Probe } from './harness.ts';

const here = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(here, '..');
const CONFIG = join(REPO, 'examples', 'calculator', 'config.yaml');
const HEAVY_TAIL_TOOLS = join(REPO, 'examples', 'calculator', 'tools-heavy-tail.yaml');
const RESULT = 'ASYNC_BENCH_RESULT ';

interface BenchOptions {
  rounds: number;
  quick: boolean;
  steps: number;
  bounds: number[];
  groups: number;
  n: number;
  heldout: number;
  tools: string;
  keep: boolean;
  /** Native core threads of the trainer in sync mode (bound 0) and in async modes. */
  syncThreads: number;
  asyncThreads: number;
  /** A mode that has not finished after this long is killed and reported as failed. */
  modeTimeoutS: number;
  /** The run config every mode starts from, and trainer.device (null: the config's). */
  config: string;
  device: 'cpu' | 'cuda' | null;
}

interface ChildSpec {
  bound: number;
  config: string;
  dataDir: string;
  overrides: Record<string, unknown>;
}

/** Per policy version, from the traces: what each step trained on and what each version started. */
interface VersionCheck {
  steps: number;
  trainedChecked: number;
  /** Trained trajectories not generated wholly by the version of the step that trained them. */
  offVersion: number;
  /** Train-split trajectories started under each policy version. */
  startedPerVersion: Record<string, number>;
}

interface ToolFigures {
  calls: number;
  timeouts: number;
  /** Call latency as the rollout measured it (the simulated delay plus the event loop's own lag). */
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** The simulated delays drawn, for comparison with the configured distribution. */
  simulatedP50Ms: number;
  simulatedP99Ms: number;
}

interface ModeResult {
  mode: string;
  bound: number;
  trainerThreads: number;
  rlSeconds: number;
  jobSeconds: number;
  trainerBusy: number;
  trainerWaitFraction: number;
  /** Mean compute time of one step: on a 2-core machine it grows when rollouts generate beside it. */
  stepComputeSeconds: number;
  generatedTokens: number;
  tokensPerSec: number;
  trainedTrajectories: number;
  trajPerSec: number;
  trajectoriesCompleted: number;
  stalenessMean: number;
  stalenessMax: number;
  droppedStale: number;
  heldoutAccuracy: number;
  heldoutProblems: number;
  speedup: number | null;
  /** null where the config keeps no traces. */
  check: VersionCheck | null;
  tools: ToolFigures | null;
  steps: StepFigures[];
}

const FLAGS = { ...ROUND_FLAGS, ...MAIN_JOB_FLAGS, tools: path, config: path, device: choice(['cpu', 'cuda'] as const) };

export function parseOptions(args: string[]): BenchOptions {
  const { values: f } = parseFlags(args, FLAGS);
  const quick = f.quick === true;
  const cores = availableParallelism();
  const steps = f.steps ?? (quick ? 2 : 20);
  return {
    rounds: f.rounds ?? (quick ? 2 : 3),
    quick,
    steps,
    bounds: f.bounds ?? (quick ? [0, 4] : [0, 1, 2, 4]),
    groups: f.groups ?? (quick ? 2 : 8),
    n: f.n ?? (quick ? 2 : 8),
    heldout: f.heldout ?? (quick ? 10 : 200),
    tools: f.tools ?? HEAVY_TAIL_TOOLS,
    keep: f.keep === true,
    syncThreads: f['sync-threads'] ?? cores,
    asyncThreads: f['async-threads'] ?? 1,
    // Generous against a loaded machine (a step takes seconds under load), short of waiting forever on a hung run.
    modeTimeoutS: f['mode-timeout'] ?? Math.max(900, steps * 60),
    config: f.config ?? CONFIG,
    device: f.device ?? null,
  };
}

const threadsFor = (o: BenchOptions, bound: number) => (bound === 0 ? o.syncThreads : o.asyncThreads);

/** Config overrides of one mode: everything but the staleness bound and the trainer's threads is the same in every mode. */
function overridesFor(o: BenchOptions, bound: number, dataDir: string): Record<string, unknown> {
  const maxBound = Math.max(...o.bounds);
  return {
    'run.data_dir': dataDir,
    'tools.config': o.tools,
    'trainer.staleness_bound': bound,
    'trainer.threads': threadsFor(o, bound),
    'trainer.max_steps': o.steps,
    'trainer.groups_per_step': o.groups,
    'rollout.n': o.n,
    // Room for the largest bound's window in every mode (the default 2 × concurrency would cap bounds > 1);
    // sync never has more than one batch in flight anyway.
    'rollout.max_inflight_trajectories': (maxBound + 1) * o.groups * o.n,
    // Held-out accuracy once, at the end, on the same problems in every mode.
    'eval.every_steps': o.steps + 1,
    'task.heldout_problems': o.heldout,
    ...(o.device ? { 'trainer.device': o.device } : {}),
  };
}

type ChildResult = { summary: MainJobSummary; steps: StepFigures[]; check: VersionCheck | null; tools: ToolFigures | null };

const runChild = (spec: ChildSpec, timeoutS: number) => runBenchChild<ChildResult>(import.meta.url, `bound ${spec.bound}`, spec, RESULT, timeoutS);

interface StepFigures {
  step: number;
  version: number;
  trajectories: number;
  stalenessMean: number;
  stalenessMax: number;
  droppedStale: number;
  computeMs: number;
  waitMs: number;
}

const compact = (s: TrainStep): StepFigures => ({
  step: s.step,
  version: s.policy_version,
  trajectories: s.trajectories,
  stalenessMean: s.staleness_mean,
  stalenessMax: s.staleness_max,
  droppedStale: s.dropped_stale,
  computeMs: s.compute_ms,
  waitMs: s.wait_ms,
});

/** Read the run's traces back: per step, the versions that generated what it trained; per version, what started. */
async function checkTraces(summary: MainJobSummary): Promise<{ check: VersionCheck; tools: ToolFigures }> {
  const run = summary.run_id;
  if (!/^[A-Za-z0-9._-]+$/.test(run)) throw new Error(`unexpected run id ${run}`);
  const store = await openTraceStore(`chdb:${join(summary.data_dir, 'chdb')}`);
  try {
    const num = (v: unknown) => Number(v);
    const perStep = await store.query(`
      SELECT s.step AS step, s.policy_version AS version, count() AS n,
             countIf(t.min_policy_version != s.policy_version OR t.max_policy_version != s.policy_version) AS off
      FROM (SELECT step, policy_version, arrayJoin(trajectory_ids) AS trajectory_id FROM train_steps FINAL WHERE run_id = '${run}') AS s
      INNER JOIN (SELECT trajectory_id, min_policy_version, max_policy_version FROM trajectories FINAL WHERE run_id = '${run}') AS t
        ON s.trajectory_id = t.trajectory_id
      GROUP BY step, version ORDER BY step`);
    const started = await store.query(`SELECT policy_version AS v, count() AS n FROM trajectory_starts FINAL WHERE run_id = '${run}' AND split = 'train' GROUP BY v ORDER BY v`);
    const tools = await store.query(`
      SELECT count() AS calls, countIf(status = 'timeout') AS timeouts, quantileExact(0.5)(latency_ms) AS p50,
             quantileExact(0.99)(latency_ms) AS p99, max(latency_ms) AS max,
             quantileExactIf(0.5)(metric_values[indexOf(metric_names, 'simulated_latency_ms')], has(metric_names, 'simulated_latency_ms')) AS sim_p50,
             quantileExactIf(0.99)(metric_values[indexOf(metric_names, 'simulated_latency_ms')], has(metric_names, 'simulated_latency_ms')) AS sim_p99
      FROM tool_calls FINAL
      WHERE run_id = '${run}' AND trajectory_id IN (SELECT trajectory_id FROM trajectories FINAL WHERE run_id = '${run}' AND split = 'train')`);
    const t = tools.rows[0] ?? {};
    return {
      check: {
        steps: perStep.rows.length,
        trainedChecked: perStep.rows.reduce((a, r) => a + num(r['n']), 0),
        offVersion: perStep.rows.reduce((a, r) => a + num(r['off']), 0),
        startedPerVersion: Object.fromEntries(started.rows.map((r) => [String(r['v']), num(r['n'])])),
      },
      tools: { calls: num(t['calls'] ?? 0), timeouts: num(t['timeouts'] ?? 0), p50Ms: num(t['p50'] ?? 0), p99Ms: num(t['p99'] ?? 0), maxMs: num(t['max'] ?? 0), simulatedP50Ms: num(t['sim_p50'] ?? 0), simulatedP99Ms: num(t['sim_p99'] ?? 0) },
    };
  } finally {
    await store.close();
  }
}

/** The child: one mode's main job in this process, then its traces read back. */
async function child(spec: ChildSpec): Promise<void> {
  const steps: StepFigures[] = [];
  const summary = await runMainJob({ configPath: spec.config, overrides: spec.overrides, admin: false, progress: false, initialEval: false, onTrainStep: (s) => steps.push(compact(s)) });
  const { check, tools } = loadRunConfig(spec.config, spec.overrides).traces.kind === 'none' ? { check: null, tools: null } : await checkTraces(summary);
  writeBenchChildResult(RESULT, { summary, steps, check, tools });
}

function modeName(bound: number): string {
  return bound === 0 ? 'sync (bound 0)' : `async bound ${bound}`;
}

function toResult(bound: number, trainerThreads: number, r: ChildResult): ModeResult {
  const { summary, steps } = r;
  const rl = summary.rl;
  const trained = steps.reduce((n, s) => n + s.trajectories, 0);
  return {
    mode: modeName(bound),
    bound,
    trainerThreads,
    rlSeconds: rl.seconds,
    jobSeconds: summary.wall_seconds,
    trainerBusy: rl.trainer_compute_seconds / rl.seconds,
    trainerWaitFraction: rl.trainer_wait_seconds / rl.seconds,
    stepComputeSeconds: rl.trainer_compute_seconds / Math.max(1, steps.length),
    generatedTokens: rl.generated_tokens,
    tokensPerSec: rl.generated_tokens / rl.seconds,
    trainedTrajectories: trained,
    trajPerSec: trained / rl.seconds,
    trajectoriesCompleted: rl.trajectories_completed,
    stalenessMean: steps.reduce((a, s) => a + s.stalenessMean * s.trajectories, 0) / Math.max(1, trained),
    stalenessMax: Math.max(0, ...steps.map((s) => s.stalenessMax)),
    droppedStale: summary.dropped_stale,
    // The calculator task always has held-out problems: null (none measured) would be a broken run.
    heldoutAccuracy: summary.heldout_accuracy_after ?? (() => { throw new Error('the final evaluation measured no problems'); })(),
    heldoutProblems: summary.heldout_problems,
    speedup: null,
    check: r.check,
    tools: r.tools,
    steps,
  };
}

/** Sync must be what it claims: each step trained on one version's batch, each version started one batch. */
function syncVerdict(r: ModeResult, o: BenchOptions): { ok: boolean; text: string } {
  const batch = o.groups * o.n;
  if (!r.check) {
    const full = r.steps.length === o.steps && r.steps.every((s) => s.trajectories === batch && s.stalenessMax === 0);
    const ok = full && r.droppedStale === 0;
    return {
      ok,
      text: ok
        ? `sync verified from its TrainSteps (no traces kept): each of the ${o.steps} steps trained one full batch of ${batch} trajectories at staleness 0, none dropped`
        : `sync NOT verified: steps ${r.steps.length}/${o.steps}, batch sizes ${JSON.stringify(r.steps.map((s) => s.trajectories))}, staleness max ${r.stalenessMax}, dropped ${r.droppedStale}`,
    };
  }
  // Versions 0 … steps-1 each start exactly one batch; the last version may start (part of) one before the
  // worker is stopped, never trained on.
  const wrong = Object.entries(r.check.startedPerVersion).filter(([v, n]) => (Number(v) < o.steps ? n !== batch : n > batch));
  const ok = r.check.offVersion === 0 && r.stalenessMax === 0 && r.droppedStale === 0 && wrong.length === 0 && r.check.steps === o.steps && r.check.trainedChecked === r.trainedTrajectories;
  const text = ok
    ? `sync verified from its traces: each of the ${r.check.steps} steps trained only on trajectories generated wholly by the step's own policy version (${r.check.trainedChecked} trajectories checked, staleness 0, none dropped), and every version started exactly one batch of ${batch} trajectories, none before the previous step was committed (rollouts waited for each update)`
    : `sync NOT verified: off-version trained trajectories ${r.check.offVersion}, staleness max ${r.stalenessMax}, dropped ${r.droppedStale}, versions not starting exactly one batch of ${batch}: ${JSON.stringify(wrong)}, steps in traces ${r.check.steps}/${o.steps}, trajectories in traces ${r.check.trainedChecked}/${r.trainedTrajectories}`;
  return { ok, text };
}

export async function main(args: string[]): Promise<unknown> {
  const o = parseOptions(args);
  const perMode = o.steps * o.groups * o.n;
  console.log(`async speed-up: main job, ${o.steps} steps × ${o.groups} groups × ${o.n} samples = ${perMode} trained trajectories per mode; ${o.rounds} interleaved rounds of ${o.bounds.map(modeName).join(', ')}; trainer threads: sync ${o.syncThreads}, async ${o.asyncThreads}; config ${o.config}${o.device ? `, trainer.device ${o.device}` : ''}; tools ${o.tools}; held-out accuracy at the end on ${o.heldout} problems${o.quick ? ' (--quick: smoke size, figures mean nothing)' : ''}`);
  const records = await interleaved<ModeResult>(
    o.bounds.map((bound) => ({
      name: modeName(bound),
      run: async (round) => {
        const dataDir = mkdtempSync(join(tmpdir(), `rlstream-bench-async-b${bound}-r${round}-`));
        let ok = false;
        try {
          const r = toResult(bound, threadsFor(o, bound), await runChild({ bound, config: o.config, dataDir, overrides: overridesFor(o, bound, dataDir) }, o.modeTimeoutS));
          ok = true;
          return r;
        } finally {
          // A failed mode keeps its data dir (its child's log is there); one failure does not cost the others.
          if (!o.keep && ok) rmSync(dataDir, { recursive: true, force: true });
          else console.log(`  data dir kept: ${dataDir}`);
        }
      },
    })),
    o.rounds,
  );
  for (const rec of records) if (rec.error) console.log(`round ${rec.round + 1} ${rec.mode}: FAILED\n${rec.error}`);
  const sync = modeName(0);
  const hasSync = o.bounds.includes(0);
  for (const rec of records) {
    const s = records.find((x) => x.round === rec.round && x.mode === sync)?.result;
    if (rec.result) rec.result.speedup = s ? s.rlSeconds / rec.result.rlSeconds : null;
  }
  const fig = (f: (r: ModeResult) => number) => summarize(records, f);
  const summary = {
    rlSeconds: fig((r) => r.rlSeconds),
    trainerBusy: fig((r) => r.trainerBusy),
    stepComputeSeconds: fig((r) => r.stepComputeSeconds),
    tokensPerSec: fig((r) => r.tokensPerSec),
    trajPerSec: fig((r) => r.trajPerSec),
    stalenessMean: fig((r) => r.stalenessMean),
    heldoutAccuracy: fig((r) => r.heldoutAccuracy),
    speedupRoundByRound: hasSync ? Object.fromEntries(o.bounds.map((b) => [modeName(b), roundRatios(records, sync, modeName(b), (r) => r.rlSeconds)])) : null,
  };
  console.log(`\nmedian [min–max] over ${o.rounds} rounds`);
  console.log('mode             threads  RL wall s             speed-up (same round)  trainer busy %        step compute s     gen tok/s           traj/s            staleness mean   held-out acc %');
  for (const b of o.bounds) {
    const m = modeName(b);
    const pct = (s: { n: number; median: number; min: number; max: number }) => ({ ...s, median: s.median * 100, min: s.min * 100, max: s.max * 100 });
    console.log(
      [
        m.padEnd(16),
        String(threadsFor(o, b)).padStart(7),
        fmtStats(summary.rlSeconds[m]!, 1).padEnd(21),
        (summary.speedupRoundByRound ? fmtStats(summary.speedupRoundByRound[m]!, 2, '×') : '-').padEnd(22),
        fmtStats(pct(summary.trainerBusy[m]!), 1).padEnd(21),
        fmtStats(summary.stepComputeSeconds[m]!, 2).padEnd(18),
        fmtStats(summary.tokensPerSec[m]!, 0).padEnd(19),
        fmtStats(summary.trajPerSec[m]!, 2).padEnd(17),
        fmtStats(summary.stalenessMean[m]!, 2).padEnd(16),
        fmtStats(pct(summary.heldoutAccuracy[m]!), 1),
      ].join(' '),
    );
  }
  console.log(`(RL wall: first rollout to the last training step; speed-up: sync RL wall / this mode's RL wall in the same round; trainer busy: Σ step compute (forward, backward, optimizer) / RL wall, the rest of its time it waits for data (Σ wait in the JSON) or checkpoints and publishes; step compute: mean per step, longer where rollouts generate beside the trainer on the same cores; gen tok/s: tokens the training rollouts generated / RL wall, trained or not; traj/s: trained trajectories / RL wall; held-out accuracy of the final policy, greedy, ${o.heldout} problems)`);
  const speed = probeSummary(records);
  console.log(`machine speed before each mode: sgemm ${fmtStats(speed.sgemmGflops, 0)} GFLOP/s, JS loop ${fmtStats(speed.jsLoopMs, 0)} ms, load ${fmtStats(speed.load1m, 1)} (per round in the report)`);
  const verdicts = records.filter((r) => r.mode === sync && r.result).map((r) => ({ round: r.round, ...syncVerdict(r.result!, o) }));
  for (const v of verdicts) console.log(`round ${v.round + 1}: ${v.text}`);
  const failures = records.filter((r) => r.error).map((r) => ({ round: r.round, mode: r.mode, error: r.error! }));
  for (const f of failures) console.log(`round ${f.round + 1} ${f.mode}: FAILED (see above)`);
  if (verdicts.some((v) => !v.ok) || failures.length > 0) process.exitCode = 1;
  const rounds = records.map((r) => ({ round: r.round, mode: r.mode, probe: r.probe as Probe, seconds: r.seconds, result: r.result ?? null, error: r.error ?? null }));
  return { options: o, trajectoriesPerMode: perMode, summary, machineSpeed: speed, rounds, failures, syncVerified: verdicts.length ? verdicts.every((v) => v.ok) : null, syncVerification: verdicts };
}

const childSpec = benchChildSpec<ChildSpec>(import.meta.url);
if (childSpec) await child(childSpec);
