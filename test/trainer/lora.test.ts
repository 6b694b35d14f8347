// trainer.lora end to end on the CPU: the trainer trains adapters over frozen weights, publishes version 0 as the
// weights and every later version as its adapters (naming version 0's file as their base), resumes from a checkpoint
// of adapters, and a reader folds a version into the base to compute what the trainer's model computes; export
// writes a version as a PEFT adapter directory; backends that load whole weights refuse adapters; the config errors.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { writePeftAdapterDir } from '../../native/lora.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { ConfigError } from '../../core/config/validate.ts';
import { parseSafetensors } from '../../core/weights/safetensors.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { LORA_FILE_FORMAT, Model, nativeAvailable } from '../../native/index.ts';
import { verifyPolicyVersion } from '../../producers/policy-sync.ts';
import { PolicyUpdates } from '../../producers/policy/updates.ts';
import type { PolicyVersion, TrainStep } from '../../schemas/generated/types.ts';
import { readAll, TINY_CONFIG, tinyTrainer, trainerInputs } from './fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const LORA = { rank: 2, alpha: 4, targets: ['q_proj', 'v_proj', 'down_proj'] };


test('trainer.lora: adapters train over frozen weights, versions publish the adapters, a reader folds them in, a restart resumes', { skip, timeout: 120_000 }, async () => {
  const { dir, logDir, weights } = await trainerInputs('trainer-lora', 'lora-test', [0, 1, 2, 3].map((g) => ({ g })), 2);
  const batch = { tokens: Int32Array.from([1, 5, 9, 3, 7, 2, 4, 6]), seqStarts: Int32Array.from([0, 8]) };
  const targets = Int32Array.from([5, 9, 3, 7, 2, 4, 6, -1]);
  try {
    const offered = new Map<number, Float32Array>();
    const run = async (maxSteps: number) => {
      const log = openEmbeddedLog({ dir: logDir });
      const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
      const onWeights = (version: number, model: Model) => {
        // the trainer's model is idle here: its log-probs at this version, to compare with a reader's
        void model.forward(batch, targets).then((r) => offered.set(version, r.logprobs));
      };
      const trainer = tinyTrainer({ log, serde, runId: 'lora-test', dataDir: join(dir, 'data'), weights }, { groups_per_step: 1, max_steps: maxSteps, threads: 1, learning_rate: 0.05, lora: LORA }, { onWeights });
      await trainer.start();
      await trainer.run();
      await trainer.close();
      return { log, serde };
    };
    await (await run(2)).log.close();
    // a second life resumes from the step-2 checkpoint (adapters and their moments over the same base)
    const { log, serde } = await run(3);
    const versions = await readAll<PolicyVersion>(log, serde, TOPICS.policyVersions, 'PolicyVersion');
    const steps = await readAll<TrainStep>(log, serde, TOPICS.trainSteps, 'TrainStep');
    await log.close();
    assert.deepEqual(steps.map((s) => s.step), [1, 2, 3]);
    assert.deepEqual(versions.map((v) => [v.policy_version, v.format]), [[0, 'safetensors'], [1, LORA_FILE_FORMAT], [2, LORA_FILE_FORMAT], [3, LORA_FILE_FORMAT]]);
    assert.ok(steps.every((s) => s.grad_norm > 0 && Number.isFinite(s.loss)));

    // version 0 is the initial weights unchanged; later versions hold the adapters alone, far smaller
    const v0 = parseSafetensors(readFileSync(versions[0]!.weights_uri)).tensors;
    const init = parseSafetensors(readFileSync(weights)).tensors;
    for (const [n, t] of init) assert.deepEqual(v0.get(n)!.data, t.data, `version 0 ${n}`);
    const v3 = parseSafetensors(readFileSync(versions[3]!.weights_uri));
    assert.deepEqual([...v3.tensors.keys()].every((n) => /\.(q_proj|v_proj|down_proj)\.lora_[AB]\.weight$/.test(n)), true);
    assert.equal(v3.tensors.size, TINY_CONFIG.num_hidden_layers * 3 * 2);
    assert.ok(statSync(versions[3]!.weights_uri).size * 5 < statSync(versions[0]!.weights_uri).size);
    assert.equal(v3.metadata.base_checksum, versions[0]!.checksum);

    // a reader verifies both files and folds the adapters into the base: the trainer's model's log-probs
    const update = await verifyPolicyVersion(versions[3]!);
    assert.equal(update.adapter?.baseWeightsPath, versions[0]!.weights_uri);
    const reader = Model.load(update.adapter!.baseWeightsPath, TINY_CONFIG, { threads: 1, trainable: false });
    await reader.mergeAdapter(update.adapter!.path);
    const got = (await reader.forward(batch, targets)).logprobs;
    const want = offered.get(3)!;
    for (let t = 0; t < 7; t++) assert.ok(Math.abs(got[t]! - want[t]!) < 1e-5, `token ${t}: reader ${got[t]} vs trainer ${want[t]}`);
    const base = await Model.load(weights, TINY_CONFIG, { threads: 1 }).forward(batch, targets);
    assert.ok(Math.max(...Array.from(got.slice(0, 7), (x, t) => Math.abs(x - base.logprobs[t]!))) > 1e-4, 'the adapters changed nothing');
    reader.dispose();
    // a backend that loads whole weights refuses a version of adapters, saying what to do
    assert.throws(() => PolicyUpdates.refuseAdapter(update, 'onnx'), /published as LoRA adapters .* the onnx backend loads whole weights only/);

    // export: a PEFT adapter directory
    const out = join(dir, 'peft');
    const cfg = await writePeftAdapterDir(out, versions[3]!.weights_uri, 'HuggingFaceTB/SmolLM2-135M', false);
    const written = JSON.parse(readFileSync(join(out, 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
    assert.deepEqual(written, cfg);
    assert.equal(written.peft_type, 'LORA');
    assert.equal(written.r, 2);
    assert.equal(written.lora_alpha, 4);
    assert.deepEqual(written.target_modules, ['q_proj', 'v_proj', 'down_proj']);
    const peft = parseSafetensors(readFileSync(join(out, 'adapter_model.safetensors'))).tensors;
    for (const [n, t] of v3.tensors) assert.deepEqual(peft.get(`base_model.model.${n}`)!.data, t.data);
    assert.equal(peft.size, v3.tensors.size);
    assert.ok(!existsSync(`${out}.tmp-${process.pid}`));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('trainer.lora config: defaults, and errors naming the field', () => {
  const o = compileTrainerOptions({ lora: { rank: 8, targets: ['down_proj', 'q_proj'] } });
  assert.deepEqual(o.lora, { rank: 8, alpha: 16, dropout: 0, targets: ['q_proj', 'down_proj'] });
  assert.equal(compileTrainerOptions({ lora: { rank: 8, dropout: 0.05 } }).lora!.dropout, 0.05);
  assert.equal(compileTrainerOptions({}).lora, null);
  assert.deepEqual(compileTrainerOptions({ lora: { rank: 4 } }).lora!.targets, ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']);
  const bad: [unknown, RegExp][] = [
    [{ rank: 0 }, /trainer\.lora\.rank/],
    [{ rank: 4, dropout: 1 }, /trainer\.lora\.dropout/],
    [{ rank: 4, targets: ['qkv'] }, /trainer\.lora\.targets/],
    [{ rank: 4, targets: ['q_proj', 'q_proj'] }, /trainer\.lora\.targets.*twice/],
    [{ rank: 4, alpha: 0 }, /trainer\.lora\.alpha/],
    [{ rank: 4, scale: 2 }, /trainer\.lora/],
  ];
  for (const [lora, re] of bad)
    assert.throws(() => compileTrainerOptions({ lora }), (e: unknown) => e instanceof ConfigError && re.test(e.message), `${JSON.stringify(lora)} should fail with ${re}`);
});

test('trainer.lora with the onnx engine fails at config check, naming the fix; with the native engine it compiles', () => {
  const cfg = join(import.meta.dirname, '..', '..', 'examples', 'calculator', 'config.yaml');
  assert.throws(
    () => loadRunConfig(cfg, { 'trainer.lora': { rank: 4 } }),
    (e: unknown) => e instanceof ConfigError && /trainer\.lora: the builtin backend on the cpu \(onnx\) cannot apply adapters: set backend\.device: cuda/.test(e.message),
  );
  const ok = loadRunConfig(cfg, { 'trainer.lora': { rank: 4 }, 'backend.device': 'cuda', 'rollout.interrupt': 'next_turn' });
  assert.deepEqual(ok.trainer.lora, { rank: 4, alpha: 8, dropout: 0, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] });
});
