// Held-out evaluation: greedy rollouts of ONE policy version on a named set of problems, scored as solved or
// not and recorded as an Evaluation event on train.steps, which the log, the learning curves, the dashboard
// and the run's summary all read. The rollouts are published like every trajectory (dataset.split 'heldout',
// so the trainer never learns from them). While an evaluation runs, the worker that hot-swaps the shared
// backend applies no new version (RolloutWorker.holdingPolicy), and every trajectory's versions are checked
// against the held one: an evaluation labelled with a version it did not measure fails instead.
import { RlstreamError } from '../../core/errors.ts';
import { deriveId, newId } from '../../core/ids.ts';
import { TOPICS } from '../../core/topics.ts';
import { normalizeOutcome } from '../../consumers/reward/shaping.ts';
import type { Evaluation, EvaluationSlice, Trajectory } from '../../schemas/generated/types.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import type { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { RolloutWorker } from '../../producers/worker.ts';
import type { RunPlugins } from './plugins.ts';
import type { RunContext } from './context.ts';
import { createWorker } from './roles.ts';

export type EvaluationPhase = 'initial' | 'periodic' | 'final' | 'checkpoint';

/** A named set of problems: the rows and what they are called in every report. */
export interface ProblemSet {
  name: string;
  rows: DatasetRow[];
}

/** The task's first `count` held-out rows (default task.heldout_problems), named by dataset, split and range. */
export async function heldoutSet(ctx: RunContext, count?: number): Promise<ProblemSet> {
  const rows = await ctx.plugins.task.heldoutRows(count ?? ctx.config.task.heldoutProblems);
  return { name: `${ctx.plugins.task.datasetName}/heldout[0:${rows.length}]`, rows };
}

/** One trajectory's outcome: its reward (the reward function's, unshaped) and whether it is solved. */
export interface Outcome {
  reward: number;
  solved: boolean;
}

/** What counts as solved, in words (the Evaluation's solved_rule). */
export function solvedRule(plugins: RunPlugins, successThreshold: number): string {
  return plugins.task.correct ? "the task's check" : `the reward function's correct flag, else reward >= ${successThreshold}`;
}

/**
 * Solved: the task's own check when it has one, else the reward function's `correct` flag, else reward at or above
 * the success threshold (eval.success_threshold). A reward that gives partial credit is not a solve.
 */
export async function outcomeOf(plugins: RunPlugins, successThreshold: number, t: Trajectory): Promise<Outcome> {
  const fn = plugins.rewardFn ?? plugins.rewards.require(t.data_source);
  const extra = JSON.parse(t.extra_info_json || '{}') as Record<string, unknown>;
  const outcome = normalizeOutcome(await fn(t.data_source, t.response_text, t.ground_truth, extra), `reward of ${t.data_source}`);
  const solved = plugins.task.correct ? plugins.task.correct(t) : (outcome.correct ?? outcome.score >= successThreshold);
  return { reward: outcome.score, solved };
}

export interface Scored {
  n: number;
  solved: number;
  mean_reward: number;
  per_difficulty: EvaluationSlice[];
}

/** The figures of a set of trajectories: count, solved, mean reward, and the same by extra_info.difficulty. */
export async function score(plugins: RunPlugins, successThreshold: number, trajectories: readonly Trajectory[]): Promise<{ scored: Scored; outcomes: Outcome[] }> {
  const outcomes: Outcome[] = [];
  for (const t of trajectories) outcomes.push(await outcomeOf(plugins, successThreshold, t));
  const slices = new Map<string, { n: number; solved: number; reward: number }>();
  trajectories.forEach((t, i) => {
    const d = (JSON.parse(t.extra_info_json || '{}') as { difficulty?: unknown }).difficulty;
    if (typeof d !== 'string' || d === '') return;
    const s = slices.get(d) ?? { n: 0, solved: 0, reward: 0 };
    s.n++;
    s.solved += outcomes[i]!.solved ? 1 : 0;
    s.reward += outcomes[i]!.reward;
    slices.set(d, s);
  });
  const n = trajectories.length;
  return {
    outcomes,
    scored: {
      n,
      solved: outcomes.filter((o) => o.solved).length,
      mean_reward: n === 0 ? 0 : outcomes.reduce((a, o) => a + o.reward, 0) / n,
      per_difficulty: [...slices.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([difficulty, s]) => ({ difficulty, n: s.n, solved: s.solved, mean_reward: s.reward / s.n })),
    },
  };
}

/** Share solved: the accuracy every report prints (null for an empty evaluation, which measured nothing). */
export function accuracyOf(e: Pick<Evaluation, 'n' | 'solved'>): number | null {
  return e.n === 0 ? null : e.solved / e.n;
}

/**
 * The one version that generated every token of these trajectories. A trajectory that generated nothing (a
 * prompt that failed to render) has no version and is left out of the check.
 */
export function versionOf(trajectories: readonly Trajectory[], held: number): number {
  for (const t of trajectories) {
    if (t.max_policy_version < 0) continue;
    if (t.min_policy_version !== held || t.max_policy_version !== held) {
      throw new RlstreamError('INTERNAL', `evaluation of policy v${held}: trajectory ${t.trajectory_id} was generated by v${t.min_policy_version}..v${t.max_policy_version}; an evaluation measures one version`);
    }
  }
  return held;
}

export interface EvaluateOptions {
  runId: string;
  /** The worker that evaluates (one that follows no versions itself). */
  evaluator: RolloutWorker;
  /** The worker that hot-swaps the shared backend, held while the evaluation runs; absent: nothing swaps it. */
  swapper?: RolloutWorker | undefined;
  backend: LlmBackend;
  set: ProblemSet;
  phase: EvaluationPhase;
  /** The training step that produced a version, when known. */
  stepOf?: (version: number) => number | null;
  /** Publish the Evaluation event (default true). */
  publish?: boolean;
}

/** Evaluate the version the backend serves now, hold it until done, score, and record the Evaluation event. */
export async function evaluateVersion(ctx: RunContext, o: EvaluateOptions): Promise<Evaluation> {
  const run = async (held: number) => ({ held, trajectories: await o.evaluator.evaluate(o.set.rows) });
  const { held, trajectories } = o.swapper ? await o.swapper.holdingPolicy(run) : await run(o.backend.currentPolicyVersion());
  const version = versionOf(trajectories, held);
  const threshold = ctx.config.eval.successThreshold;
  const { scored } = await score(ctx.plugins, threshold, trajectories);
  const event: Evaluation = {
    event_id: deriveId(o.runId, 'evaluation', newId()),
    time_ms: Date.now(),
    run_id: o.runId,
    policy_version: version,
    step: o.stepOf ? o.stepOf(version) : null,
    phase: o.phase,
    problem_set: o.set.name,
    ...scored,
    solved_rule: solvedRule(ctx.plugins, threshold),
    trajectory_ids: trajectories.map((t) => t.trajectory_id),
  };
  if (o.publish !== false) await publishEvaluation(ctx, event);
  return event;
}

/** Evaluations go on train.steps, keyed by run like the steps, so a reader of the run's progress sees both in order. */
export async function publishEvaluation(ctx: Pick<RunContext, 'log' | 'serde'>, event: Evaluation): Promise<void> {
  const producer = await ctx.log.producer();
  try {
    await producer.send(TOPICS.trainSteps, [{ key: event.run_id, value: ctx.serde.encode('Evaluation', event) }]);
  } finally {
    await producer.close();
  }
}

/** One line for people: "v12 (step 12) on calculator/heldout[0:200]: 71/200 solved (35.5%), mean reward 0.36". */
export function describeEvaluation(e: Evaluation): string {
  const acc = accuracyOf(e);
  const at = e.step === null ? `v${e.policy_version}` : `v${e.policy_version} (step ${e.step})`;
  return `${at} on ${e.problem_set}: ${e.solved}/${e.n} solved${acc === null ? '' : ` (${(acc * 100).toFixed(1)}%)`}, mean reward ${e.mean_reward.toFixed(3)}`;
}

/**
 * `rlstream worker rollout` with eval.every_versions: evaluate every k-th policy version the training worker
 * applies (version 0 first) until stopped. Returns a function that stops the loop and waits for the evaluation
 * in flight.
 */
export async function evaluatePeriodically(ctx: RunContext, runId: string, backend: LlmBackend, tokenizer: ChatTokenizer, swapper: RolloutWorker, everyVersions: number, onResult?: (e: Evaluation) => void): Promise<() => Promise<void>> {
  const evaluator = await createWorker(ctx, runId, backend, tokenizer, { followPolicy: false });
  const set = await heldoutSet(ctx);
  let stopped = false;
  let last = -1;
  const loop = (async () => {
    while (!stopped) {
      const version = backend.currentPolicyVersion();
      if (version > last && (version === 0 || version - Math.max(0, last) >= everyVersions)) {
        const e = await evaluateVersion(ctx, { runId, evaluator, swapper, backend, set, phase: version === 0 ? 'initial' : 'periodic' });
        last = e.policy_version;
        onResult?.(e);
      } else await new Promise((r) => setTimeout(r, 200));
    }
  })();
  return async () => {
    stopped = true;
    await loop;
    await evaluator.stop();
  };
}
