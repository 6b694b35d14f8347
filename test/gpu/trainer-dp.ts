// The trainer of `rlstream run` on 1..N GPUs (trainer.devices, issue #53): the Trainer class itself over an embedded
// log of synthetic advantaged trajectories, one process per GPU (consumers/trainer/parallel/launcher.ts), NCCL
// between them. Weak scaling, as test/gpu/dp.sh measures the driver: each GPU trains `--per-gpu` trajectories of
// `--seq` tokens a step. Prints one JSON line per rank count: the steps' compute tokens/s (TrainStep.compute_ms:
// the step's forward, backward, collectives and AdamW on rank 0) and wall tokens/s (with the step's checkpoint and
// its transaction), after a first step left out as warm-up.
//   node --import tsx test/gpu/trainer-dp.ts [--shape 0.5B|1.5B] [--ranks 1,2] [--steps 4] [--per-gpu 8] [--seq 1024]
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { deriveId } from '../../core/ids.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { rng } from '../../core/random.ts';
import { Model, type ModelConfig } from '../../native/index.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { Trainer } from '../../consumers/trainer/trainer.ts';
import type { AdvantagedTrajectory, TrainStep } from '../../schemas/generated/types.ts';
import { singleTurnTrajectory, tempDir } from '../../testkit/events.ts';

// Qwen2.5's shapes (hidden, layers, heads, KV heads, MLP, vocabulary), as test/gpu/dp.sh's driver builds them
const SHAPES: Record<string, [number, number, number, number, number, number]> = {
  '0.5B': [896, 24, 14, 2, 4864, 151936],
  '1.5B': [1536, 28, 12, 2, 8960, 151936],
};

const { values } = parseArgs({ options: { shape: { type: 'string', default: '0.5B' }, ranks: { type: 'string', default: '1,2' }, steps: { type: 'string', default: '4' }, 'per-gpu': { type: 'string', default: '8' }, seq: { type: 'string', default: '1024' } } });
const [hidden, layers, heads, kvHeads, ffn, vocab] = SHAPES[values.shape!] ?? (() => { throw new Error(`--shape: one of ${Object.keys(SHAPES).join(', ')}`); })();
const config: ModelConfig = { hidden_size: hidden, num_hidden_layers: layers, num_attention_heads: heads, num_key_value_heads: kvHeads, intermediate_size: ffn, vocab_size: vocab, rope_theta: 1e6, rms_norm_eps: 1e-6, tie_word_embeddings: false, max_position_embeddings: 4096, attention_bias: true, model_type: 'qwen2' };
const steps = Number(values.steps);
const perGpu = Number(values['per-gpu']);
const seq = Number(values.seq);
const GROUP = 4;

const dir = tempDir('trainer-dp');
const weights = join(dir, 'init.safetensors');
{
  const t0 = Date.now();
  const m = Model.init(config, { seed: 1, device: 'cuda', trainable: false });
  await m.save(weights);
  m.dispose();
  console.error(`initial weights written in ${(Date.now() - t0) / 1000} s`);
}

for (const ranks of values.ranks!.split(',').map(Number)) {
  const logDir = join(dir, `log-${ranks}`);
  const log = openEmbeddedLog({ dir: logDir });
  for (const name of [TOPICS.advantaged, TOPICS.trainSteps, TOPICS.policyVersions, TOPICS.control]) await log.createTopic({ name, partitions: 1 });
  const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
  const groupsPerStep = (perGpu * ranks) / GROUP;
  const r = rng(ranks);
  const producer = await log.producer();
  for (let g = 0; g < groupsPerStep * steps; g++) {
    const groupId = deriveId('dp', g);
    const events: AdvantagedTrajectory[] = Array.from({ length: GROUP }, (_, k) => {
      const prompt = Array.from({ length: seq / 4 }, () => Math.floor(r() * vocab));
      const response = Array.from({ length: seq - seq / 4 }, () => Math.floor(r() * vocab));
      const score = k % 2;
      return {
        event_id: deriveId(groupId, k),
        time_ms: Date.now(),
        trajectory: singleTurnTrajectory({
          run_id: 'dp', trajectory_id: deriveId(groupId, 't', k), group_id: groupId, sample_index: k, group_size: GROUP, data_source: 'synthetic',
          dataset: { name: 'synthetic', split: 'train', index: g }, ground_truth: '1', prompt_ids: prompt, response_ids: response,
          response_mask: response.map(() => 1), response_logprobs: response.map(() => -11.9), response_policy_versions: response.map(() => 0),
          response_text: 'x', min_policy_version: 0, max_policy_version: 0, started_ms: 0, completed_ms: 1, generation_ms: 0,
        }),
        reward: { score, components: [], reward_fn: 'synthetic', correct: score === 1, token_rewards: null, exclude_from_loss: false },
        estimator: 'grpo',
        advantages: response.map(() => (score === 1 ? 1 : -1)),
        returns: response.map(() => score),
        group: { group_members: GROUP, expected_size: GROUP, reward_mean: 0.5, reward_std: 0.5, partial: false },
      };
    });
    await producer.send(TOPICS.advantaged, events.map((e) => ({ key: groupId, value: serde.encode('AdvantagedTrajectory', e) })));
  }
  await producer.close();
  const options = compileTrainerOptions({
    device: 'cuda', devices: ranks, groups_per_step: groupsPerStep, max_steps: steps, staleness_bound: 1000, keep_checkpoints: 1, keep_versions: 1,
    max_tokens_per_micro_batch: seq * 2, learning_rate: 1e-6, grad_clip: 1, publish_every: steps,
  });
  const seen: { e: TrainStep; at: number }[] = [];
  const trainer = new Trainer({ log, serde, runId: 'dp', dataDir: join(dir, `data-${ranks}`), initialWeightsPath: weights, modelConfig: config, options, followControl: false, onStep: (e) => seen.push({ e, at: Date.now() }) });
  const t0 = Date.now();
  await trainer.start();
  const started = Date.now();
  await trainer.run();
  await trainer.close();
  await log.close();
  const timed = seen.slice(1);
  const tokens = timed.reduce((n, s) => n + s.e.tokens, 0);
  const compute = timed.reduce((n, s) => n + s.e.compute_ms, 0) / 1000;
  const wall = (timed.at(-1)!.at - seen[0]!.at) / 1000;
  console.log(JSON.stringify({ shape: values.shape, ranks, tokens_per_step: timed[0]?.e.tokens, steps_timed: timed.length, compute_tokens_per_s: Math.round(tokens / compute), wall_tokens_per_s: Math.round(tokens / wall), step_compute_s: timed.map((s) => s.e.compute_ms / 1000), step_wall_s: wall / timed.length, start_s: (started - t0) / 1000, loss: seen.map((s) => s.e.loss) }));
}
