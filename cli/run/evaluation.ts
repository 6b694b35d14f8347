// Held-out evaluation of the policy a rollout backend serves: greedy rollouts on the task's held-out rows,
// published like every trajectory (dataset.split 'heldout', so the trainer never learns from them) and
// scored by the reward consumer — the numbers live in the log and the traces. Correctness is the task's hook,
// else the reward function's own `correct` (else a positive score).
import type { Trajectory } from '../../schemas/generated/types.ts';
import { normalizeOutcome } from '../../consumers/reward/shaping.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import type { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { RunPlugins } from './plugins.ts';
import type { RunContext } from './context.ts';
import { createWorker } from './roles.ts';

async function isCorrect(plugins: RunPlugins, t: Trajectory): Promise<boolean> {
  if (plugins.task.correct) return plugins.task.correct(t);
  const fn = plugins.rewardFn ?? plugins.rewards.require(t.data_source);
  const extra = JSON.parse(t.extra_info_json || '{}') as Record<string, unknown>;
  const outcome = normalizeOutcome(await fn(t.data_source, t.response_text, t.ground_truth, extra), `reward of ${t.data_source}`);
  return outcome.correct ?? outcome.score > 0;
}

/** Fraction of trajectories the task counts as correct. */
export async function accuracy(plugins: RunPlugins, trajectories: readonly Trajectory[]): Promise<number> {
  if (trajectories.length === 0) return 0;
  let correct = 0;
  for (const t of trajectories) if (await isCorrect(plugins, t)) correct++;
  return correct / trajectories.length;
}

/** The task's first `count` held-out rows (default task.heldout_problems). */
export function heldoutRows(ctx: RunContext, count?: number): Promise<DatasetRow[]> {
  return ctx.plugins.task.heldoutRows(count ?? ctx.config.task.heldoutProblems);
}

/**
 * Evaluate every `everyVersions`-th policy version the backend takes on (version 0 first) until stopped.
 * Returns a function that stops the loop and waits for the evaluation in flight.
 */
export async function evaluatePeriodically(ctx: RunContext, runId: string, backend: LlmBackend, tokenizer: ChatTokenizer, everyVersions: number, onResult?: (version: number, correct: number, total: number) => void): Promise<() => Promise<void>> {
  const evaluator = await createWorker(ctx, runId, backend, tokenizer, { followPolicy: false });
  const rows = await heldoutRows(ctx);
  let stopped = false;
  let last = -1;
  const loop = (async () => {
    while (!stopped) {
      const version = backend.currentPolicyVersion();
      if (version > last && (version === 0 || version - Math.max(0, last) >= everyVersions)) {
        last = version;
        const trajectories = await evaluator.evaluate(rows);
        onResult?.(version, Math.round((await accuracy(ctx.plugins, trajectories)) * trajectories.length), trajectories.length);
      } else await new Promise((r) => setTimeout(r, 200));
    }
  })();
  return async () => {
    stopped = true;
    await loop;
    await evaluator.stop();
  };
}
