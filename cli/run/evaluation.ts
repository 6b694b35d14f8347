// Held-out evaluation of the policy a rollout backend serves: greedy tool-agent rollouts on the task's
// held-out problems, published like every trajectory (dataset.split 'heldout', so the trainer never learns
// from them) and scored by the reward consumer — the numbers live in the log and the traces.
import type { Trajectory } from '../../schemas/generated/types.ts';
import { calculatorReward } from '../../examples/calculator/reward.ts';
import type { LlmBackend } from '../../producers/backends/types.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import type { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { difficultyByName, problemRows } from '../../examples/calculator/index.ts';
import { take } from '../../examples/calculator/task.ts';
import type { RunContext } from './context.ts';
import { createWorker, section } from './roles.ts';

/** Fraction of trajectories whose final answer is right, by the task's own reward function. */
export function accuracy(trajectories: readonly Trajectory[]): number {
  if (trajectories.length === 0) return 0;
  let correct = 0;
  for (const t of trajectories) if (calculatorReward(t.data_source, t.response_text, t.ground_truth).correct) correct++;
  return correct / trajectories.length;
}

export function heldoutRows(ctx: RunContext, count?: number): DatasetRow[] {
  const task = section(ctx, 'task');
  const n = count ?? (typeof task['heldout_problems'] === 'number' ? task['heldout_problems'] : 200);
  return take(problemRows(ctx.config.run.seed + 7, 'heldout', difficultyByName(task['heldout'] ?? 'medium', 'task.heldout')), n);
}

/**
 * Evaluate every `everyVersions`-th policy version the backend takes on (version 0 first) until stopped.
 * Returns a function that stops the loop and waits for the evaluation in flight.
 */
export async function evaluatePeriodically(ctx: RunContext, runId: string, backend: LlmBackend, tokenizer: ChatTokenizer, everyVersions: number, onResult?: (version: number, correct: number, total: number) => void): Promise<() => Promise<void>> {
  const evaluator = await createWorker(ctx, runId, backend, tokenizer, { followPolicy: false });
  const rows = heldoutRows(ctx);
  let stopped = false;
  let last = -1;
  const loop = (async () => {
    while (!stopped) {
      const version = backend.currentPolicyVersion();
      if (version > last && (version === 0 || version - Math.max(0, last) >= everyVersions)) {
        last = version;
        const trajectories = await evaluator.evaluate(rows);
        onResult?.(version, Math.round(accuracy(trajectories) * trajectories.length), trajectories.length);
      } else await new Promise((r) => setTimeout(r, 200));
    }
  })();
  return async () => {
    stopped = true;
    await loop;
    await evaluator.stop();
  };
}
