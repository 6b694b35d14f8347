// The trainer role: SIGKILLed at random moments and restarted, it resumes from the checkpoint of its last
// committed step with the committed offsets, so every sample is used exactly once and policy versions are
// contiguous; samples beyond the staleness bound are dropped and counted; non-train samples are skipped.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { Trainer } from '../../consumers/trainer/trainer.ts';
import type { PolicyVersion, TrainStep } from '../../schemas/generated/types.ts';
import { readSafetensors } from '../../core/weights/safetensors.ts';
import type { Model } from '../../native/index.ts';
import { readAll, TINY_CONFIG, tinyTrainer, trainerInputs } from './fixtures/synthetic.ts';

const PROCESS = join(import.meta.dirname, 'fixtures', 'trainer-process.ts');

function setUp(groups: { g: number; version?: number; split?: string }[], groupSize: number): Promise<{ dir: string; logDir: string; weights: string }> {
  return trainerInputs('trainer', 'restart-test', groups, groupSize, 2);
}


test('trainer killed with SIGKILL at random moments resumes with no sample reused or lost', { timeout: 240_000 }, async () => {
  const GROUPS = 48;
  const SIZE = 4;
  const STEPS = GROUPS / 2;
  const { dir, logDir, weights } = await setUp(Array.from({ length: GROUPS }, (_, g) => ({ g })), SIZE);
  try {
    let kills = 0;
    let finished = false;
    const started = Date.now();
    while (!finished) {
      assert.ok(Date.now() - started < 200_000, `trainer did not finish after ${kills} kills`);
      const child = spawn(process.execPath, ['--import', 'tsx', PROCESS, logDir, join(dir, 'data'), weights, String(STEPS)], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let onReady: () => void = () => {};
      const ready = new Promise<void>((r) => (onReady = r));
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        if (out.includes('ready')) onReady();
      });
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      const exit = new Promise<number | null>((r) => child.on('exit', (code) => (onReady(), r(code))));
      if (kills < 6) {
        // Kill somewhere in the middle of a run: a step, a checkpoint or a commit (a step takes tens of ms).
        await ready;
        await new Promise((r) => setTimeout(r, Math.random() * 60));
        if (child.exitCode === null) {
          child.kill('SIGKILL');
          kills++;
        }
        await exit;
        finished = out.includes('done');
      } else {
        const code = await exit;
        assert.equal(code, 0, `trainer failed: ${out.slice(-2000)}`);
        finished = true;
      }
    }
    const log = openEmbeddedLog({ dir: logDir });
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const steps = await readAll<TrainStep>(log, serde, TOPICS.trainSteps, 'TrainStep');
    const versions = await readAll<PolicyVersion>(log, serde, TOPICS.policyVersions, 'PolicyVersion');
    await log.close();
    assert.ok(kills >= 3, `only ${kills} kills landed`);
    assert.deepEqual(steps.map((s) => s.step), Array.from({ length: STEPS }, (_, i) => i + 1), 'steps are contiguous, each committed once');
    assert.deepEqual(versions.map((v) => v.policy_version), Array.from({ length: STEPS + 1 }, (_, i) => i), 'policy versions are contiguous from 0');
    const used = steps.flatMap((s) => s.trajectory_ids);
    assert.equal(new Set(used).size, used.length, 'no trajectory used twice');
    assert.equal(used.length, GROUPS * SIZE, 'every trajectory used');
    for (const v of versions.slice(1)) assert.equal(v.parent, v.policy_version - 1);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Run an in-process trainer over the set-up log until it stops (max_steps); the log stays open for reading back. */
async function trainInProcess(dir: string, logDir: string, weights: string, options: Record<string, unknown>, extra: { modelConfigJson?: string; onWeights?: (version: number, model: Model) => void } = {}): Promise<{ log: EventLog; serde: EventSerde; trainer: Trainer; seen: TrainStep[] }> {
  const log = openEmbeddedLog({ dir: logDir });
  const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
  const seen: TrainStep[] = [];
  const trainer = tinyTrainer({ log, serde, runId: 'restart-test', dataDir: join(dir, 'data'), weights }, { max_steps: 1, threads: 1, ...options }, { ...extra, onStep: (s) => seen.push(s) });
  await trainer.start();
  await trainer.run();
  await trainer.close();
  return { log, serde, trainer, seen };
}

test('trainer drops samples beyond the staleness bound and skips held-out samples, counting both', { timeout: 60_000 }, async () => {
  // The trainer starts at version 0; groups generated "at version -3" lag by 3 > bound 2.
  const groups = [{ g: 0 }, { g: 1, version: -3 }, { g: 2, split: 'heldout' }, { g: 3 }, { g: 4, version: -2 }];
  const { dir, logDir, weights } = await setUp(groups, 2);
  try {
    const { log, trainer, seen } = await trainInProcess(dir, logDir, weights, { groups_per_step: 3, staleness_bound: 2 });
    await log.close();
    assert.equal(seen.length, 1);
    const step = seen[0]!;
    // Groups 0, 3 (lag 0) and 4 (lag 2 = bound) are trained on; group 1 (lag 3) is dropped; group 2 is held-out.
    assert.equal(step.trajectories, 6);
    assert.equal(step.dropped_stale, 2);
    assert.equal(trainer.counters.droppedStale, 2);
    assert.equal(trainer.counters.skippedNonTrain, 2);
    assert.equal(step.staleness_max, 2);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a run that ends with groups too stale to train on still consumes them: a step that records the drops and changes no weight', { timeout: 60_000 }, async () => {
  // Without a later group to carry them, these samples used to wait for a step that never came.
  const { dir, logDir, weights } = await setUp([{ g: 0, version: -5 }, { g: 1, version: -4 }], 2);
  try {
    const { log, serde, seen } = await trainInProcess(dir, logDir, weights, { groups_per_step: 1, staleness_bound: 2 });
    const versions = await readAll<PolicyVersion>(log, serde, TOPICS.policyVersions, 'PolicyVersion');
    const committed = await log.committed('restart-test.trainer', TOPICS.advantaged);
    await log.close();
    assert.equal(seen.length, 1);
    const step = seen[0]!;
    assert.equal(step.trajectories, 0);
    assert.equal(step.dropped_stale, 4);
    assert.equal(step.dropped_trajectory_ids.length, 4);
    // Published on schedule (the rollouts' staleness gate counts versions as steps), with unchanged weights.
    assert.equal(step.produced_version, 1);
    assert.deepEqual(versions.map((v) => v.policy_version), [0, 1]);
    assert.equal(versions[1]!.checksum, versions[0]!.checksum, 'same weights');
    assert.equal(committed.reduce((n, c) => n + c.offset, 0), 4, 'every sample offset committed');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("every policy version carries the model's config.json as read (servers loading a version need its architectures)", { timeout: 60_000 }, async () => {
  const { dir, logDir, weights } = await setUp([{ g: 0 }], 2);
  try {
    const raw = JSON.stringify({ ...TINY_CONFIG, architectures: ['LlamaForCausalLM'], model_type: 'llama', torch_dtype: 'float32' });
    const { log, serde } = await trainInProcess(dir, logDir, weights, { groups_per_step: 1 }, { modelConfigJson: raw });
    const versions = await readAll<PolicyVersion>(log, serde, TOPICS.policyVersions, 'PolicyVersion');
    await log.close();
    assert.deepEqual(versions.map((v) => v.policy_version), [0, 1]);
    for (const v of versions) assert.equal(v.config_json, raw);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("onWeights offers each new version in the trainer's model, equal to the version's stored file", { timeout: 60_000 }, async () => {
  const { dir, logDir, weights } = await setUp([{ g: 0 }, { g: 1 }], 2);
  try {
    const offered: { version: number; params: Record<string, Float32Array> }[] = [];
    const onWeights = (version: number, model: Model) => offered.push({ version, params: Object.fromEntries([...model.parameters()].map(([k, v]) => [k, Float32Array.from(v.data)])) });
    const { log, serde } = await trainInProcess(dir, logDir, weights, { groups_per_step: 1, max_steps: 2 }, { onWeights });
    const versions = await readAll<PolicyVersion>(log, serde, TOPICS.policyVersions, 'PolicyVersion');
    await log.close();
    assert.deepEqual(offered.map((o) => o.version), [1, 2], 'every produced version, not the initial one');
    for (const o of offered) {
      const stored = await readSafetensors(versions.find((v) => v.policy_version === o.version)!.weights_uri);
      for (const [name, t] of stored) assert.deepEqual(o.params[name], t.data, `version ${o.version} ${name}`);
    }
    assert.notDeepEqual(offered[0]!.params, offered[1]!.params);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the policy loss the options name is the one trained, and the step records its metrics and the correction fractions', { timeout: 60_000 }, async () => {
  const { dir, logDir, weights } = await setUp([{ g: 0 }, { g: 1 }], 2);
  try {
    // A mask window so narrow that the trainer's proximal policy must fall outside it for some tokens.
    const options = { groups_per_step: 2, staleness_bound: 2, policy_loss: 'gspo', gspo: { clip_low: 0.1, clip_high: 0.1 }, rollout_correction: { mode: 'mask', low: 0.999, high: 1.001 } };
    const { log, seen } = await trainInProcess(dir, logDir, weights, options);
    await log.close();
    assert.equal(seen.length, 1);
    const metrics = new Map(seen[0]!.metrics.map((m) => [m.name, m.value]));
    assert.equal(metrics.get('loss/gspo/clip_frac'), seen[0]!.clip_fraction);
    assert.equal(metrics.has('loss/ppo/clip_frac'), false, 'only the selected loss reports');
    const masked = metrics.get('loss/correction/masked_frac')!;
    assert.ok(masked > 0 && masked <= 1, `masked fraction ${masked}`);
    assert.equal(metrics.get('loss/correction/truncated_frac'), 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("each step's AdamW update uses the scheduled learning rate, and the step records that rate", { timeout: 60_000 }, async () => {
  const { dir, logDir, weights } = await setUp([{ g: 0 }, { g: 1 }, { g: 2 }, { g: 3 }], 2);
  try {
    const offered = new Map<number, Map<string, Float32Array>>();
    const onWeights = (version: number, model: Model) => offered.set(version, new Map([...model.parameters()].map(([k, v]) => [k, Float32Array.from(v.data)])));
    const options = { groups_per_step: 1, max_steps: 4, learning_rate: 0.01, lr_schedule: 'linear', warmup_steps: 2, min_lr_ratio: 0.2, weight_decay: 0 };
    const { log, seen } = await trainInProcess(dir, logDir, weights, options, { onWeights });
    await log.close();
    // Warm-up 0.005, 0.01; then linear over the 2 remaining steps: 0.01 at its start, 0.01 × (0.2 + 0.8 × 0.5) halfway.
    const expected = [0.005, 0.01, 0.01, 0.006];
    assert.deepEqual(seen.map((s) => s.step), [1, 2, 3, 4]);
    seen.forEach((s, i) => assert.ok(Math.abs(s.learning_rate - expected[i]!) < 1e-12, `step ${s.step} recorded ${s.learning_rate}`));
    // AdamW's first update moves each parameter with a non-zero gradient by lr × g/(|g| + eps): the largest move is
    // the rate the update used (the warm-up's half rate), not the configured peak.
    const initial = await readSafetensors(weights);
    let largest = 0;
    for (const [name, t] of initial) {
      const after = offered.get(1)!.get(name)!;
      for (let i = 0; i < after.length; i++) largest = Math.max(largest, Math.abs(after[i]! - t.data[i]!));
    }
    assert.ok(Math.abs(largest - 0.005) < 0.005 * 0.01, `first update moved a parameter by at most ${largest}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('after set_staleness lowers the bound with nothing left to train, the trainer takes empty steps up to the version that reopens the rollout gate', { timeout: 60_000 }, async () => {
  // Every group the rollouts started under the old bound was trained before the command: no record comes, and the
  // rollout gate (counting versions) stays shut until new versions; without them both ends would wait forever.
  // Lowered at version 0 from 3 to 1, the gate may have started groups for versions up to 3 and reopens at version
  // 0 + 3 - 1 + 1 = 3.
  const { dir, logDir, weights } = await setUp([], 2);
  const log = openEmbeddedLog({ dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const seen: TrainStep[] = [];
    const trainer = tinyTrainer({ log, serde, runId: 'restart-test', dataDir: join(dir, 'data'), weights }, { max_steps: 10, threads: 1, groups_per_step: 1, staleness_bound: 3 }, { followControl: false, onStep: (s) => seen.push(s) });
    await trainer.start();
    trainer.onControl({ event_id: 'c1', time_ms: Date.now(), run_id: 'restart-test', command: 'set_staleness', staleness_bound: 1, reason: 'test', issued_by: null });
    const running = trainer.run();
    const t0 = Date.now();
    while (seen.length < 3 && Date.now() - t0 < 30_000) await new Promise((r) => setTimeout(r, 200));
    // A fourth would let versions run ahead of rollouts that are merely slow.
    await new Promise((r) => setTimeout(r, 5_000));
    trainer.stop();
    await running;
    await trainer.close();
    assert.deepEqual(seen.map((s) => [s.step, s.trajectories, s.produced_version]), [[1, 0, 1], [2, 0, 2], [3, 0, 3]]);
    const versions = await readAll<PolicyVersion>(log, serde, TOPICS.policyVersions, 'PolicyVersion');
    assert.deepEqual(versions.map((v) => v.policy_version), [0, 1, 2, 3]);
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a rebalance that hands the trainer its partitions back from the committed offsets trains no sample twice', { timeout: 60_000 }, async () => {
  // Kafka does this when the broker comes back after the session expired: the member rejoins and reads again from
  // what its last step committed, while the records it read past that still sit in its next batch.
  const groups = Array.from({ length: 8 }, (_, g) => ({ g }));
  const { dir, logDir, weights } = await setUp(groups, 2);
  const log = openEmbeddedLog({ dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const seen: TrainStep[] = [];
    let rebalanced: Promise<void> | null = null;
    const onStep = (s: TrainStep) => {
      seen.push(s);
      // A second member joins (taking a partition) and leaves (handing it back from the committed offset).
      if (s.step === 2) rebalanced = log.consumer({ groupId: 'restart-test.trainer', topics: [TOPICS.advantaged] }).then((c) => c.close());
    };
    const trainer = tinyTrainer({ log, serde, runId: 'restart-test', dataDir: join(dir, 'data'), weights }, { max_steps: 0, threads: 1, groups_per_step: 1, staleness_bound: 8 }, { followControl: false, onStep });
    await trainer.start();
    const running = trainer.run();
    const t0 = Date.now();
    while (seen.length < 8 && Date.now() - t0 < 30_000) await new Promise((r) => setTimeout(r, 100));
    // Records handed back would be polled once the batch read before the rebalance is used up.
    await new Promise((r) => setTimeout(r, 1_500));
    trainer.stop();
    await running;
    await trainer.close();
    assert.ok(rebalanced !== null, 'the rebalance ran');
    await rebalanced;
    assert.ok(trainer.counters.redelivered > 0, 'the rebalance handed records back');
    const ids = seen.flatMap((s) => s.trajectory_ids);
    assert.equal(new Set(ids).size, ids.length, `a sample trained twice: ${ids.length} trained, ${new Set(ids).size} distinct`);
    assert.equal(ids.length, 16, 'every sample trained');
    const committed = await log.committed('restart-test.trainer', TOPICS.advantaged);
    assert.equal(committed.reduce((n, c) => n + c.offset, 0), 16, 'every sample offset committed');
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
