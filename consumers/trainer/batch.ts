// Packing of trajectories into training micro-batches: each trajectory is one sequence
// (prompt ++ response) and position t predicts token t+1, so every per-response-token array
// (response_mask, advantages, behaviour log-probs) shifts left by one onto the prompt's last position.
// Sequences are packed back to back without padding; a micro-batch holds at most `maxTokens` tokens.
import type { AdvantagedTrajectory } from '../../schemas/generated/types.ts';

export interface TrainSample {
  trajectoryId: string;
  /** The trajectory's group: a data-parallel step gives a group's members to one rank (parallel/shard.ts). */
  groupId: string;
  tokens: number[];
  /** Index of the first response token in `tokens`. */
  promptLength: number;
  responseMask: number[];
  advantages: number[];
  behaviourLogprobs: number[];
  /** Lag of the oldest generating version behind the trainer's version at intake. */
  staleness: number;
  reward: number;
  toolCalls: number;
  toolErrors: number;
}

export interface PackedMicroBatch {
  tokens: Int32Array;
  seqStarts: Int32Array;
  targets: Int32Array;
  /** Each sample's responseMask on the packed positions that predict its response tokens. */
  responseMask: Float32Array;
  advantages: Float32Array;
  behaviourLogprobs: Float32Array;
  /** Which samples (by index into the step's list) the micro-batch holds, in order. */
  samples: number[];
  maskedTokens: number;
}

export function sampleFromEvent(e: AdvantagedTrajectory, trainerVersion: number): TrainSample {
  const t = e.trajectory;
  return {
    trajectoryId: t.trajectory_id,
    groupId: t.group_id,
    tokens: [...t.prompt_ids, ...t.response_ids],
    promptLength: t.prompt_ids.length,
    // A trajectory the reward role kept out of the loss (e.g. DAPO overlong filtering) trains on no token.
    responseMask: e.reward.exclude_from_loss ? t.response_mask.map(() => 0) : t.response_mask,
    advantages: e.advantages,
    behaviourLogprobs: t.response_logprobs,
    staleness: trainerVersion - t.min_policy_version,
    reward: e.reward.score,
    toolCalls: t.num_tool_calls,
    // Errors include calls that failed to parse, which never became calls: count attempts as the larger.
    toolErrors: t.num_tool_errors,
  };
}

/** Greedy packing in arrival order: a new micro-batch starts when the next sequence would not fit. */
export function packMicroBatches(samples: TrainSample[], maxTokens: number): PackedMicroBatch[] {
  const groups: number[][] = [];
  let current: number[] = [];
  let used = 0;
  samples.forEach((s, i) => {
    if (current.length > 0 && used + s.tokens.length > maxTokens) {
      groups.push(current);
      current = [];
      used = 0;
    }
    current.push(i);
    used += s.tokens.length;
  });
  if (current.length > 0) groups.push(current);
  return groups.map((idx) => pack(samples, idx));
}

function pack(samples: TrainSample[], idx: number[]): PackedMicroBatch {
  const total = idx.reduce((n, i) => n + samples[i]!.tokens.length, 0);
  const tokens = new Int32Array(total);
  const seqStarts = new Int32Array(idx.length + 1);
  const targets = new Int32Array(total).fill(-1);
  const responseMask = new Float32Array(total);
  const advantages = new Float32Array(total);
  const behaviourLogprobs = new Float32Array(total);
  let off = 0;
  let maskedTokens = 0;
  idx.forEach((i, k) => {
    const s = samples[i]!;
    seqStarts[k] = off;
    tokens.set(s.tokens, off);
    for (let t = 0; t + 1 < s.tokens.length; t++) targets[off + t] = s.tokens[t + 1]!;
    for (let r = 0; r < s.responseMask.length; r++) {
      const pos = off + s.promptLength + r - 1; // the position whose next-token prediction is response token r
      if (s.responseMask[r] !== 1) continue;
      responseMask[pos] = 1;
      advantages[pos] = s.advantages[r] ?? 0;
      behaviourLogprobs[pos] = s.behaviourLogprobs[r] ?? 0;
      maskedTokens++;
    }
    off += s.tokens.length;
  });
  seqStarts[idx.length] = off;
  return { tokens, seqStarts, targets, responseMask, advantages, behaviourLogprobs, samples: idx, maskedTokens };
}
