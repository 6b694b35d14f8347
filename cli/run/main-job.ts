// The main job on the embedded default: every role in one process — rollout worker (built-in policy through
// onnxruntime-node), reward, advantage, trainer (native core), trace sink (chDB) and the admin server. It
// warm-starts from the SFT checkpoint (training one when missing), measures held-out accuracy before and
// after asynchronous GRPO, draws the learning curves and returns the figures; nothing is written by hand.
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { maskSecrets } from '../config/run-config.ts';
import { describeError, RlstreamError } from '../../core/errors.ts';
import { TOPICS } from '../../core/topics.ts';
import { checkDeviceRunsHere } from '../../consumers/trainer/device.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { serveAdmin, type ServedAdmin } from '../../admin/serve.ts';
import { jsonLogger, type Logger } from '../../core/telemetry.ts';
import type { Evaluation, TrainStep } from '../../schemas/generated/types.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { lineChartsSvg, type Line } from '../plot.ts';
import { openRunContext, openRunTraces, type RunContext } from './context.ts';
import { accuracyOf, describeEvaluation, evaluateVersion, heldoutSet, type EvaluationPhase, type ProblemSet } from './evaluation.ts';
import { Progress } from './progress.ts';
import { createAdvantage, createBackend, createReward, createTraceSink, createTrainer, createWorker, loadTokenizer, modelFiles, trainRows, initFiles } from './roles.ts';
import { warmStart } from './sft.ts';
import { checkConfig, problemsReport } from './preflight.ts';
import { chooseRun, finishRun, resumedState, type RunChoice } from './resume.ts';
import { openServeEndpoint, TOKENS_VARIABLE, writeServeUrl, type ServeEndpoint } from './serve-endpoint.ts';

export interface MainJobOptions {
  configPath: string;
  overrides?: Record<string, unknown>;
  /** Start the admin server beside the run (default true). */
  admin?: boolean;
  /** Progress bars on stderr (default: when stderr is a TTY). */
  progress?: boolean;
  logger?: Logger;
  /** Measure held-out accuracy of the warm start before RL (default true; benchmarks comparing runs skip it). */
  initialEval?: boolean;
  /** Every durable TrainStep, as the trainer commits it (benchmarks). */
  onTrainStep?: (step: TrainStep) => void;
  /** The run directory: a new one (default), the newest unfinished one of this configuration, or a given one (cli/run/resume.ts). */
  run?: RunChoice;
}

/** The RL phase alone (first rollout to the last training step), for throughput figures. */
export interface RlPhaseFigures {
  seconds: number;
  /** Tokens the training rollout worker generated (trained or not), and the trajectories it completed. */
  generated_tokens: number;
  trajectories_completed: number;
  /** Trajectories and tokens (prompt + response) the trainer trained on. */
  trained_trajectories: number;
  trained_tokens: number;
  /** Sum over steps of the trainer's compute time (forward, backward, optimizer) and of its wait for data. */
  trainer_compute_seconds: number;
  trainer_wait_seconds: number;
  tool_latency_ms: { p50: number; p99: number; max: number; count: number };
  /**
   * Rollout–trainer log-prob mismatch (|behaviour − recomputed| on trained tokens, before each update): the mean of
   * the steps' means and the largest of their maxima. Numerics alone when the backend and trainer agree.
   */
  logprob_mismatch: { mean: number; max: number };
  /**
   * A backend running its model in this process (backend.device cuda): seconds of the RL phase its forward steps
   * took (evaluations during RL included) and its loading of new versions; with trainer_compute_seconds, how a
   * GPU shared by both divides its time. null for backends elsewhere.
   */
  backend_seconds: { generate: number; load_weights: number } | null;
}

/** One evaluation as the summary lists it (the Evaluation event's figures, with the share solved). */
export interface EvaluationFigures {
  phase: string;
  policy_version: number;
  step: number | null;
  problem_set: string;
  n: number;
  solved: number;
  /** solved / n: the share of the problems solved. */
  accuracy: number | null;
  /** Mean outcome reward of the reward function (no shaping): not a share solved. */
  mean_reward: number;
}

export interface MainJobSummary {
  run_id: string;
  seed: number;
  /** Share of heldout_problem_set solved by the warm start; null when the run skipped the initial evaluation. */
  heldout_accuracy_before: number | null;
  /** Share of heldout_problem_set solved by the final policy. */
  heldout_accuracy_after: number | null;
  /** Mean outcome reward over the same problems, before and after (partial credit counts here, not above). */
  heldout_mean_reward_before: number | null;
  heldout_mean_reward_after: number;
  heldout_problems: number;
  heldout_problem_set: string;
  /** Every evaluation of the run, in order: each of one policy version on a named problem set. */
  evaluations: EvaluationFigures[];
  steps: number;
  trajectories: number;
  policy_versions: number;
  dropped_stale: number;
  /** The staleness bound each end enforced at the end (trainer.staleness_bound, or a later set_staleness). */
  staleness_bound: { rollout: number | null; trainer: number };
  tool_success_rate_first: number;
  tool_success_rate_last: number;
  sft_seconds: number | null;
  wall_seconds: number;
  rl: RlPhaseFigures;
  plot: string;
  data_dir: string;
}

export async function runMainJob(options: MainJobOptions): Promise<MainJobSummary> {
  const t0 = performance.now();
  // Before a run directory exists: a run that cannot start must not be left as an unfinished run to resume. The
  // preflight is `config check`'s own (the trainer's GPUs included), so a config it passes starts and one it refuses
  // writes nothing.
  const { config, problems } = await checkConfig(options.configPath, options.overrides ?? {});
  if (config === null || problems.length > 0) throw new RlstreamError('CONFIG_INVALID', problemsReport(options.configPath, problems));
  checkDeviceRunsHere(config.trainer.device);
  const chosen = chooseRun(config, options.run ?? { kind: 'new' });
  const { runId, runDir } = chosen;
  process.stderr.write(`run: ${chosen.message}\n`);
  mkdirSync(runDir, { recursive: true });
  const logger = options.logger ?? jsonLogger({ level: 'warn' });
  const run = { ...config, run: { ...config.run, id: runId, dataDir: runDir } };
  const embedded = run.log.kind === 'embedded' ? { ...run, log: { ...run.log, dir: join(runDir, 'log') } } : run;
  const traced = embedded.traces.kind === 'chdb' ? { ...embedded, traces: { ...embedded.traces, dir: join(runDir, 'chdb') } } : embedded;
  // A model.init that does not exist is trained now (SFT, below) into the run's directory: a run writes nothing
  // into the source tree (a mistyped path there would become a new checkpoint folder beside the shipped one).
  const init = traced.model.init;
  const sftInto = init !== null && !existsSync(initFiles(init).initWeights) ? join(runDir, 'sft') : null;
  if (sftInto) process.stderr.write(`run: model.init ${init} does not exist: training the warm start now (SFT) into ${sftInto}\n`);
  const ctx = await openRunContext(sftInto ? { ...traced, model: { ...traced.model, init: sftInto } } : traced, logger);
  const progress = new Progress(options.progress ?? process.stderr.isTTY === true);
  const closers: (() => Promise<unknown>)[] = [];
  try {
    // 1. Warm start: the shipped SFT checkpoint, or SFT now.
    const files = modelFiles(ctx);
    let sftSeconds: number | null = null;
    if (!existsSync(files.initWeights)) {
      const bar = progress.bar('sft', 1);
      const res = await warmStart(ctx, files.initCheckpoint ?? files.initWeights, (info, total) => bar.update(info.step, total, `loss ${info.loss.toFixed(3)}`));
      sftSeconds = res.seconds;
      bar.done();
    }

    // 2. Roles.
    const tokenizer = loadTokenizer(files);
    const traces = await openRunTraces(ctx.config);
    if (traces) closers.push(() => traces.close());
    const reward = await createReward(ctx);
    const advantage = createAdvantage(ctx);
    const sink = traces ? createTraceSink(ctx, traces) : null;
    const backend = await createBackend(ctx, { device: ctx.config.trainer.device, adapters: ctx.config.trainer.lora !== null });
    closers.push(() => backend.close());
    // A resumed run carries on from its log: its steps so far, and the trajectories not to run again.
    const prior = chosen.resumed ? await resumedState(ctx.log, ctx.serde, runId) : null;
    const worker = await createWorker(ctx, runId, backend, tokenizer, prior ? { resume: prior.resume } : {});
    // Evaluation gets its own worker that does not follow policy versions: the training worker hot-swaps the
    // shared backend, and evaluation must never wait at the staleness gate.
    const evaluator = await createWorker(ctx, runId, backend, tokenizer, { followPolicy: false });
    const topt = ctx.config.trainer;
    const steps: TrainStep[] = [...(prior?.steps ?? [])];
    const evaluations: Evaluation[] = [...(prior?.evaluations ?? [])];
    // The step that produced each version: an evaluation is drawn at its version's step.
    const stepOfVersion = new Map<number, number>([[0, 0]]);
    const noteStep = (s: TrainStep) => s.produced_version !== null && stepOfVersion.set(s.produced_version, s.step);
    steps.forEach(noteStep);
    const stepBar = progress.bar('train', topt.maxSteps);
    const trainer = createTrainer(ctx, runId, runDir, (s) => {
      steps.push(s);
      noteStep(s);
      options.onTrainStep?.(s);
      stepBar.update(s.step, topt.maxSteps, `v${s.produced_version ?? s.policy_version} reward ${s.reward_mean.toFixed(2)} stale ${s.staleness_mean.toFixed(1)}`);
    }, undefined, backend.stageWeights?.bind(backend));
    await trainer.start();
    // On a failure (a role that throws, an evaluation that cannot finish) every role still running is stopped
    // before the stores and the log close under it: left running, their poll loops would retry LOG_CLOSED
    // forever and the run would never exit.
    let rolesStopped = false;
    closers.unshift(async () => {
      if (rolesStopped) return;
      const stops = [() => worker.stop({ abort: true }), () => evaluator.stop(), () => reward.stop(), () => advantage.stop(), async () => sink?.stop(), () => trainer.close()];
      for (const stop of stops) await stop().catch((err: unknown) => logger.warn('stopping a role after a failure', { error: describeError(err) }));
    });
    const admin = options.admin === false ? null : await startAdmin(ctx, traces, runId, runDir, topt.stalenessBound, tokenizer);
    if (admin) closers.unshift(() => admin.close());
    // The OpenAI-compatible endpoint on the run's own backend (serve.enabled): an outside agent's trajectories join
    // the run's rollouts in the log and are rewarded and trained on with them. The training worker keeps the
    // shared backend on the newest policy, so the endpoint follows no versions itself.
    const serve = ctx.config.serve.enabled ? await startServe(ctx, backend, tokenizer, runDir, config.run.id) : null;
    if (serve) closers.unshift(() => serve.close());

    // 3. Held-out accuracy of the warm start. Every evaluation is of one version (the training worker holds the
    // shared backend meanwhile) and becomes an Evaluation event; the summary, the curves and the dashboard read those.
    const heldout = await heldoutSet(ctx);
    const during = duringSet(heldout, ctx.config.eval.problems);
    const everySteps = ctx.config.eval.everySteps;
    const evalBar = progress.bar('eval', heldout.rows.length);
    const evaluate = async (set: ProblemSet, phase: EvaluationPhase): Promise<Evaluation> => {
      const e = await evaluateVersion(ctx, { runId, evaluator, swapper: worker, backend, set, phase, stepOf: (v) => stepOfVersion.get(v) ?? null });
      evaluations.push(e);
      evalBar.update(e.n, set.rows.length, `${phase}: ${describeEvaluation(e)}`);
      return e;
    };
    let initial = evaluations.find((e) => e.phase === 'initial') ?? null;
    if (options.initialEval !== false && initial === null) initial = await evaluate(heldout, 'initial');

    // 4. Asynchronous RL: rollouts, reward, advantage, trainer and sink run concurrently.
    const rlStart = performance.now();
    const backendAtStart = backend.deviceSeconds?.();
    const running = [reward.run(), advantage.run(), ...(sink ? [sink.run()] : [])];
    const rollouts = worker.run(trainRows(ctx));
    // A worker that fails (a dataset line that is not a row, say) ends the run with its error; one that finishes its
    // rows leaves the trainer to finish on what is in the log.
    const rolloutsFailed = rollouts.then(() => new Promise<never>(() => {}));
    let evalChain: Promise<void> = Promise.resolve();
    const trainerDone = (async () => {
      let lastEval = trainer.currentStep;
      const check = setInterval(() => {
        const s = trainer.currentStep;
        if (s - lastEval >= everySteps && s < topt.maxSteps) {
          lastEval = s;
          const version = trainer.currentPolicyVersion();
          evalChain = evalChain.then(async () => {
            // The version the trainer has just published, once the training worker has applied it.
            await waitFor(() => backend.currentPolicyVersion() >= version, 60_000);
            await evaluate(during, 'periodic');
          });
        }
      }, 250);
      try {
        await trainer.run();
      } finally {
        clearInterval(check);
      }
    })();
    await Promise.race([trainerDone, rolloutsFailed, ...running.map((p) => p.then(() => Promise.reject(new Error('a stream processor stopped early'))))]);
    const rlSeconds = (performance.now() - rlStart) / 1000;
    const backendAtEnd = backend.deviceSeconds?.();
    const backendSeconds = backendAtStart && backendAtEnd ? { generate: backendAtEnd.generate - backendAtStart.generate, load_weights: backendAtEnd.loadWeights - backendAtStart.loadWeights } : null;
    // Training is over: the endpoint stops taking calls and completes its open trajectories (as aborted) while
    // the reward consumer still reads them, and leaves the backend to the final evaluation.
    await serve?.close();
    const rollout = worker.snapshot();
    // The training worker applies the last version to the shared backend before it stops.
    await waitFor(() => backend.currentPolicyVersion() >= trainer.currentPolicyVersion(), 30_000);
    await worker.stop({ abort: true });
    await rollouts.catch((err) => logger.warn('rollouts ended with an error', { error: describeError(err) }));
    await evalChain;

    // 5. Held-out accuracy of the final policy.
    const final = await evaluate(heldout, 'final');
    await evaluator.stop();

    // 6. Let the sink catch up so the traces hold the whole run, then stop everything.
    await Promise.all([reward.stop(), advantage.stop()]);
    if (sink) await sink.stop();
    await Promise.allSettled(running);
    await trainer.close();
    rolesStopped = true;
    progress.stop();

    const plot = join(runDir, 'learning-curves.svg');
    writeFileSync(plot, curves(runId, steps, evaluations));
    const toolRate = (s: TrainStep | undefined) => (s ? stepMetric(s, 'tool_success_rate') : 0);
    return finishRun(runDir, {
      run_id: runId,
      seed: config.run.seed,
      heldout_accuracy_before: initial ? accuracyOf(initial) : null,
      heldout_accuracy_after: accuracyOf(final),
      heldout_mean_reward_before: initial ? initial.mean_reward : null,
      heldout_mean_reward_after: final.mean_reward,
      heldout_problems: heldout.rows.length,
      heldout_problem_set: heldout.name,
      evaluations: evaluations.map(figures),
      steps: trainer.currentStep,
      trajectories: steps.reduce((n, s) => n + s.trajectories, 0),
      policy_versions: trainer.currentPolicyVersion() + 1,
      dropped_stale: trainer.counters.droppedStale,
      staleness_bound: { rollout: rollout.stalenessBound, trainer: trainer.currentStalenessBound },
      tool_success_rate_first: toolRate(steps[0]),
      tool_success_rate_last: toolRate(steps[steps.length - 1]),
      sft_seconds: sftSeconds,
      wall_seconds: (performance.now() - t0) / 1000,
      rl: {
        seconds: rlSeconds,
        generated_tokens: rollout.generatedTokens,
        trajectories_completed: rollout.trajectoriesCompleted,
        trained_trajectories: steps.reduce((n, s) => n + s.trajectories, 0),
        trained_tokens: steps.reduce((n, s) => n + s.tokens, 0),
        trainer_compute_seconds: steps.reduce((n, s) => n + s.compute_ms, 0) / 1000,
        trainer_wait_seconds: steps.reduce((n, s) => n + s.wait_ms, 0) / 1000,
        tool_latency_ms: { p50: rollout.toolLatencyMs.p50, p99: rollout.toolLatencyMs.p99, max: rollout.toolLatencyMs.max, count: rollout.toolLatencyMs.count },
        logprob_mismatch: logprobMismatchOf(steps),
        backend_seconds: backendSeconds,
      },
      plot,
      data_dir: runDir,
    });
  } finally {
    progress.stop();
    for (const close of closers) await close().catch(() => {});
    await ctx.close();
  }
}

/**
 * The run's rollout–trainer mismatch over the steps that trained on something: a step that only dropped stale
 * samples, or an empty one after a lowered staleness bound, compared no token and would pull the mean to 0.
 */
function logprobMismatchOf(steps: TrainStep[]): { mean: number; max: number } {
  const trained = steps.filter((s) => s.trajectories > 0);
  return {
    mean: trained.reduce((n, s) => n + stepMetric(s, 'logprob_mismatch_mean'), 0) / Math.max(1, trained.length),
    max: trained.reduce((n, s) => Math.max(n, stepMetric(s, 'logprob_mismatch_max')), 0),
  };
}

/** A named metric of a training step (0 when the step did not record it). */
function stepMetric(s: TrainStep, name: string): number {
  return s.metrics.find((m) => m.name === name)?.value ?? 0;
}

async function waitFor(cond: () => boolean, timeoutMs: number): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond() && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
}

/** The problems evaluated during RL: the whole held-out set, or its first eval.problems rows under their own name. */
export function duringSet(heldout: ProblemSet, problems: number | null): ProblemSet {
  if (problems === null || problems >= heldout.rows.length) return heldout;
  return { name: heldout.name.replace(/\[0:\d+\]$/, '') + `[0:${problems}]`, rows: heldout.rows.slice(0, problems) };
}

function figures(e: Evaluation): EvaluationFigures {
  return { phase: e.phase, policy_version: e.policy_version, step: e.step, problem_set: e.problem_set, n: e.n, solved: e.solved, accuracy: accuracyOf(e), mean_reward: e.mean_reward };
}

const SET_COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#9467bd'];

/**
 * The learning curves, from the run's train steps and Evaluation events. Each evaluation is drawn at the step that
 * produced its version (its version when that is unknown); evaluations on different problem sets are different
 * lines, each named by its set, and the share solved and the mean reward are different panels. The per-step
 * reward is noisy (a step is a few groups): its moving average is drawn over it.
 */
export function curves(runId: string, steps: TrainStep[], evaluations: readonly Evaluation[]): string {
  const sets = [...new Set(evaluations.map((e) => e.problem_set))];
  const perSet = (y: (e: Evaluation) => number | null): Line[] =>
    sets.map((set, i) => ({
      label: set,
      color: SET_COLORS[i % SET_COLORS.length]!,
      points: evaluations
        .filter((e) => e.problem_set === set && y(e) !== null)
        .map((e) => ({ x: e.step ?? e.policy_version, y: y(e)! }))
        .sort((a, b) => a.x - b.x),
    }));
  return lineChartsSvg(`rlstream main job ${runId}`, 'training step', [
    { name: 'reward (mean of the step’s samples)', points: steps.map((s) => ({ x: s.step, y: s.reward_mean })), smooth: Math.max(3, Math.round(steps.length / 10)), yMin: 0, yMax: 1 },
    { name: 'held-out accuracy (share solved), at the evaluated version', lines: perSet(accuracyOf), yMin: 0, yMax: 1 },
    { name: 'held-out mean reward, same evaluations', lines: perSet((e) => (e.n === 0 ? null : e.mean_reward)) },
    { name: 'tool-call success rate', points: steps.map((s) => ({ x: s.step, y: stepMetric(s, 'tool_success_rate') })), yMin: 0, yMax: 1 },
    { name: 'staleness (mean policy-version lag)', points: steps.map((s) => ({ x: s.step, y: s.staleness_mean })) },
  ]);
}

/** The serve role: its URL goes to the terminal, the URL and a generated token only into a 0600 file. */
async function startServe(ctx: RunContext, backend: LlmBackend, tokenizer: ChatTokenizer, runDir: string, configuredId: string): Promise<ServeEndpoint> {
  // Clients name the model as the config names the run: the run directory's id (seed, start time) is new each run.
  const settings = { ...ctx.config.serve, model: ctx.config.serve.model ?? configuredId };
  const endpoint = await openServeEndpoint(ctx, { backend, tokenizer, settings, logger: ctx.logger });
  const file = writeServeUrl(runDir, endpoint);
  process.stderr.write(`serve: ${endpoint.url}/v1 (OpenAPI at ${endpoint.url}/openapi.json; ${endpoint.generatedToken ? `URL and token in ${file}` : `tokens from ${TOKENS_VARIABLE}`})\n`);
  return endpoint;
}

/** The admin server beside the run; its URL goes to the terminal, the token only into a 0600 file. */
async function startAdmin(ctx: RunContext, store: TraceStore | null, runId: string, runDir: string, stalenessBound: number, tokenizer: ChatTokenizer): Promise<ServedAdmin> {
  // The dashboard's token chips show each token's text (ids on hover).
  const tokenTexts = (ids: readonly number[]) => ids.map((id) => tokenizer.decode([id]));
  const port = ctx.config.admin.port;
  let admin: ServedAdmin;
  try {
    admin = await serveAdmin({ log: ctx.log, serde: ctx.serde, store, logger: ctx.logger.child({ role: 'admin' }), port, tokenTexts });
  } catch (err) {
    // A busy fixed port must not stop the run: fall back to any free port.
    if (port === 0) throw err;
    admin = await serveAdmin({ log: ctx.log, serde: ctx.serde, store, logger: ctx.logger.child({ role: 'admin' }), port: 0, tokenTexts });
  }
  const group = (role: string, topics: string[]) => ({ groupId: `${runId}.${role}`, topics });
  admin.runs.add({
    id: runId,
    config: maskSecrets(ctx.config.effective) as Record<string, unknown>,
    stalenessBound,
    consumerGroups: {
      reward: group('reward', [TOPICS.rolloutEvents]),
      advantage: group('advantage', [TOPICS.rewarded]),
      trainer: group('trainer', [TOPICS.advantaged]),
      traces: group('traces', [TOPICS.rolloutEvents, TOPICS.rewarded, TOPICS.advantaged]),
    },
  });
  const link = join(runDir, 'admin-url');
  // Removed first: a file left by an earlier start of this run keeps its mode when rewritten, and only a new
  // file gets 0600.
  rmSync(link, { force: true });
  writeFileSync(link, `${admin.url}/dashboard/${admin.generatedToken ? `#token=${admin.generatedToken}` : ''}\n`, { mode: 0o600 });
  process.stderr.write(`admin: ${admin.url}/dashboard/ (API ${admin.url}/api, docs ${admin.url}/docs; link with token in ${link})\n`);
  return admin;
}
