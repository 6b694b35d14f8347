// DAPO's overlong handling from config: the soft overlong penalty over the last overlong_buffer_len tokens before
// rollout.response_length (a reward component), and overlong filtering (mask_truncated), which sets the contract's
// RewardInfo.exclude_from_loss; a trajectory so marked trains on no token, whatever its components are named.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compileRunConfig, ConfigError } from '../../cli/config/run-config.ts';
import { composeReward, overlongPenalty } from '../../consumers/reward/shaping.ts';
import { eventType } from '../../schemas/index.ts';
import { packMicroBatches, sampleFromEvent } from '../../consumers/trainer/batch.ts';
import { trajectory } from '../../testkit/events.ts';
import type { AdvantagedTrajectory, Trajectory } from '../../schemas/generated/types.ts';

const outcome = { components: [{ name: 'outcome', value: 1 }], correct: true };

function shapingOf(shaping: Record<string, unknown>, responseLength: number) {
  return compileRunConfig({ rollout: { response_length: responseLength }, reward: { shaping } }, '/tmp').reward.shaping;
}

function traj(tokens: number, termination: Trajectory['termination'] = 'stop'): Trajectory {
  return { ...trajectory({ groupId: 'g', index: 0, tokens }), termination };
}

test('the overlong penalty is 0 before the buffer, linear inside it and the full factor at the limit (DAPO R_length)', () => {
  // DAPO: R = ((L_max - L_cache) - |y|) / L_cache for L_max - L_cache < |y| <= L_max, -1 beyond, 0 before.
  const L = 100;
  const B = 20;
  for (const len of [0, 50, 80, 81, 90, 99, 100, 130]) {
    const dapo = len <= L - B ? 0 : len <= L ? (L - B - len) / B : -1;
    assert.ok(Math.abs(overlongPenalty(len, L, B, 0.5) - 0.5 * dapo) < 1e-12, `length ${len}`);
  }
  assert.equal(overlongPenalty(99, L, 0, 1), 0, 'buffer 0: off');
});

test('reward.shaping.overlong_* from config add a shaping.overlong component the score sums', () => {
  const shaping = shapingOf({ overlong_buffer_len: 16, overlong_penalty_factor: 2 }, 64);
  const inBuffer = composeReward(traj(56), outcome, 'f', shaping);
  const overlong = inBuffer.components.find((c) => c.name === 'shaping.overlong');
  assert.ok(overlong, 'component present');
  assert.ok(Math.abs(overlong.value - -2 * (56 - 48) / 16) < 1e-12);
  assert.ok(Math.abs(inBuffer.score - (1 + overlong.value)) < 1e-12);
  const short = composeReward(traj(48), outcome, 'f', shaping);
  assert.equal(short.components.some((c) => c.name === 'shaping.overlong'), false, 'no penalty before the buffer');
  assert.equal(short.score, 1);
  // off by default
  assert.equal(composeReward(traj(63), outcome, 'f', shapingOf({}, 64)).score, 1);
});

test('mask_truncated marks a trajectory cut at the token limit, and the trainer trains on none of its tokens', () => {
  const shaping = shapingOf({ mask_truncated: true }, 64);
  const cut = composeReward(traj(24, 'max_tokens'), outcome, 'f', shaping);
  const done = composeReward(traj(24, 'stop'), outcome, 'f', shaping);
  assert.equal(cut.exclude_from_loss, true);
  assert.equal(done.exclude_from_loss, false);
  assert.equal(composeReward(traj(24, 'max_tokens'), outcome, 'f', shapingOf({}, 64)).exclude_from_loss, false, 'off by default');
  // The exclusion is no component: the score and components of a cut trajectory are those of an uncut one.
  assert.deepEqual([cut.score, cut.components], [done.score, done.components]);

  const event = (t: Trajectory, reward: typeof cut): AdvantagedTrajectory => ({ trajectory: t, reward, advantages: t.response_mask.map((m) => m * 0.5) }) as unknown as AdvantagedTrajectory;
  const samples = [sampleFromEvent(event(traj(24, 'max_tokens'), cut), 3), sampleFromEvent(event(traj(24, 'stop'), done), 3)];
  assert.equal(samples[0]!.responseMask.reduce((a, b) => a + b, 0), 0);
  const kept = samples[1]!.responseMask.reduce((a, b) => a + b, 0);
  assert.ok(kept > 0);
  assert.equal(packMicroBatches(samples, 4096).reduce((n, mb) => n + mb.maskedTokens, 0), kept);
});

test('the exclusion crosses to the trainer as the Avro field, and a component name carries no meaning', () => {
  const shaping = shapingOf({ mask_truncated: true }, 64);
  const type = eventType('AdvantagedTrajectory');
  const through = (t: Trajectory, reward: ReturnType<typeof composeReward>): AdvantagedTrajectory =>
    type.fromBuffer(type.toBuffer({ event_id: 'e', time_ms: 1, trajectory: t, reward, estimator: 'grpo', advantages: t.response_mask.map((m) => m * 0.5), returns: t.response_mask.map(() => 0), group: { group_members: 1, expected_size: 1, reward_mean: 1, reward_std: 0, partial: false } })) as AdvantagedTrajectory;
  const cut = through(traj(24, 'max_tokens'), composeReward(traj(24, 'max_tokens'), outcome, 'f', shaping));
  assert.equal(cut.reward.exclude_from_loss, true);
  assert.equal(sampleFromEvent(cut, 3).responseMask.reduce((a, b) => a + b, 0), 0);
  // A reward function that names a component as the old marker did excludes nothing: only the field does.
  const named = composeReward(traj(24, 'stop'), { components: [{ name: 'outcome', value: 1 }, { name: 'shaping.truncated_masked', value: 0 }], correct: true }, 'f', shaping);
  assert.equal(named.exclude_from_loss, false);
  assert.ok(sampleFromEvent(through(traj(24, 'stop'), named), 3).responseMask.reduce((a, b) => a + b, 0) > 0);
});

test('an overlong buffer as long as the response limit fails naming the field', () => {
  assert.throws(
    () => compileRunConfig({ rollout: { response_length: 32 }, reward: { shaping: { overlong_buffer_len: 32 } } }, '/tmp'),
    (err: unknown) => err instanceof ConfigError && err.issues.some((i) => i.path === 'reward.shaping.overlong_buffer_len' && /below rollout\.response_length \(32\)/.test(i.message)),
  );
});
