// Shared fixtures of the stream-processor tests and the consumers benchmark: trajectories, events, and a
// serde whose schema ids are the same in every process (a fresh MemoryRegistry registers in EVENT_NAMES order).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MemoryRegistry } from '../core/serde/registry.ts';
import { EventSerde } from '../core/serde/events.ts';
import type { RewardedTrajectory, RewardInfo, Trajectory, TrajectoryCompleted } from '../schemas/generated/types.ts';

export async function newSerde(): Promise<EventSerde> {
  return new EventSerde(new MemoryRegistry()).init();
}

/** The directories tempDir made in this process. */
const made: string[] = [];

/**
 * A fresh directory under the OS's temporary one, removed when the process exits (a test file's process, a
 * benchmark's), whether its tests passed or not: callers need not remove it themselves.
 */
export function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), `rlstream-${prefix}-`));
  if (made.push(dir) === 1)
    process.once('exit', () => {
      for (const d of made) rmSync(d, { recursive: true, force: true });
    });
  return dir;
}

export interface TrajectorySpec {
  groupId: string;
  index: number;
  groupSize?: number;
  tokens?: number;
  text?: string;
  groundTruth?: string;
  dataSource?: string;
  split?: string;
}

/** The fields a single-turn agent's trajectory always has the same: one assistant turn, no tools, stopped. */
type SingleTurnConstants =
  | 'agent_name'
  | 'extra_info_json'
  | 'turn_offsets'
  | 'turn_roles'
  | 'num_turns'
  | 'num_tool_calls'
  | 'num_tool_errors'
  | 'num_invalid_tool_calls'
  | 'tool_rewards'
  | 'interaction_rewards'
  | 'termination'
  | 'tool_ms'
  | 'external_reward';

/** A single-turn trajectory from the fields that vary. */
export function singleTurnTrajectory(fields: Omit<Trajectory, SingleTurnConstants>): Trajectory {
  return {
    ...fields,
    agent_name: 'single_turn',
    extra_info_json: '{}',
    turn_offsets: [0],
    turn_roles: ['assistant'],
    num_turns: 1,
    num_tool_calls: 0,
    num_tool_errors: 0,
    num_invalid_tool_calls: 0,
    tool_rewards: [],
    interaction_rewards: [],
    termination: 'stop',
    tool_ms: 0,
    external_reward: null,
  };
}

export function trajectory(s: TrajectorySpec): Trajectory {
  const n = s.tokens ?? 8;
  const mask = Array.from({ length: n }, (_, t) => (t % 10 === 9 ? 0 : 1));
  return singleTurnTrajectory({
    run_id: 'run-test',
    trajectory_id: `${s.groupId}/${s.index}`,
    group_id: s.groupId,
    sample_index: s.index,
    group_size: s.groupSize ?? 8,
    data_source: s.dataSource ?? 'gsm8k',
    dataset: { name: 'gsm8k', split: s.split ?? 'train', index: 0 },
    ground_truth: s.groundTruth ?? '72',
    prompt_ids: Array.from({ length: 16 }, (_, t) => t + 1),
    response_ids: Array.from({ length: n }, (_, t) => (t * 7 + s.index) % 1000),
    response_mask: mask,
    response_logprobs: mask.map((m) => (m ? -0.5 : 0)),
    response_policy_versions: mask.map((m) => (m ? 3 : -1)),
    response_text: s.text ?? (s.index % 2 === 0 ? 'so the answer is\n#### 72' : 'I think #### 71'),
    min_policy_version: 3,
    max_policy_version: 3,
    started_ms: 1,
    completed_ms: 2,
    generation_ms: 1,
  });
}

export function completed(t: Trajectory): TrajectoryCompleted {
  return { event_id: `tc-${t.trajectory_id}`, time_ms: 2, trajectory: t };
}

export function rewarded(t: Trajectory, score: number): RewardedTrajectory {
  const reward: RewardInfo = { score, components: [{ name: 'outcome', value: score }], reward_fn: 'test', correct: score > 0, token_rewards: null, exclude_from_loss: false };
  return { event_id: `rw-${t.trajectory_id}`, time_ms: 3, trajectory: t, reward };
}
