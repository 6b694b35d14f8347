// `rlstream export`: a real trainer trains a tiny Qwen3 model that came from a Hugging Face directory and
// publishes policy versions into an embedded log; the command (run as users run it) writes a version back as a
// directory of shards, index, config, tokenizer and generation config, whose weights are the version's exactly
// (f32) or rounded (bf16), and which the native core loads and scores as the trainer's model. It refuses an
// existing --out (and replaces it with --force), an unknown version, and weights whose sha256 does not match.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { readIndex, readWeights } from '../../core/weights/hf-dir.ts';
import { parseModelConfig } from '../../core/weights/model-config.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { Trainer } from '../../consumers/trainer/trainer.ts';
import { Model, nativeAvailable } from '../../native/index.ts';
import { writeTinyModelDir } from '../../testkit/hf-model.ts';
import { BIN } from '../admin/helpers.ts';
import { pack, randomSeqs, rng, maxAbsDiff } from '../native/helpers.ts';
import { trainerInputs } from '../trainer/fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';

function exportCli(...args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [BIN, 'export', ...args], { encoding: 'utf8', timeout: 120_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

test('export writes a trained version as a Hugging Face directory the native core loads as the trainer had it', { skip, timeout: 240_000 }, async () => {
  const { dir, logDir } = await trainerInputs('export', 'export-test', Array.from({ length: 4 }, (_, g) => ({ g })), 2);
  const base = join(dir, 'base');
  writeTinyModelDir(base, { family: 'qwen3', shards: 2, vocab: 32, seed: 4 });
  const configJson = readFileSync(join(base, 'config.json'), 'utf8');
  const modelConfig = parseModelConfig(configJson);
  // the run directory as the main job leaves it: run.json naming the model's directories, the log, the trainer's data
  writeFileSync(join(dir, 'run.json'), JSON.stringify({ run_id: 'export-test', config_hash: 'x', created_at: new Date().toISOString(), model: { base, tokenizer: base, chat_template: null } }));
  const log = openEmbeddedLog({ dir: logDir });
  const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
  const offered = new Map<number, Map<string, Float32Array>>();
  const onWeights = (version: number, model: Model): void => void offered.set(version, new Map([...model.parameters()].map(([k, v]) => [k, Float32Array.from(v.data)])));
  const trainer = new Trainer({ log, serde, runId: 'export-test', dataDir: join(dir, 'data'), initialWeightsPath: base, modelConfig, modelConfigJson: configJson, options: compileTrainerOptions({ max_steps: 2, groups_per_step: 2, threads: 1, learning_rate: 1e-2 }), onWeights });
  await trainer.start();
  await trainer.run();
  await trainer.close();
  const trained = offered.get(2)!;
  assert.ok(trained, `versions offered: ${[...offered.keys()].join(', ')}`);
  await log.close();

  const out = join(dir, 'exported');
  const r = exportCli(dir, '--out', out, '--max-shard-size', '20000');
  assert.equal(r.status, 0, r.stderr);
  const summary = JSON.parse(r.stdout) as { version: number; checksum: string };
  assert.equal(summary.version, 2, 'the newest version by default');
  const files = readdirSync(out).sort();
  const shards = files.filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f));
  assert.ok(shards.length >= 3, `sharded at 20 kB: ${files.join(', ')}`);
  for (const f of ['config.json', 'generation_config.json', 'model.safetensors.index.json', 'tokenizer.json', 'tokenizer_config.json']) assert.ok(files.includes(f), f);
  assert.deepEqual(new Set(readIndex(out).weightMap.values()), new Set(shards));
  // config.json: the model's own keys, the dtype the shards hold; generation_config.json: the base directory's
  const written = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')) as Record<string, unknown>;
  assert.deepEqual(written, { ...JSON.parse(configJson), torch_dtype: 'float32' });
  assert.deepEqual(JSON.parse(readFileSync(join(out, 'generation_config.json'), 'utf8')), JSON.parse(readFileSync(join(base, 'generation_config.json'), 'utf8')));
  // the weights are the trainer's after its second step, bit for bit, and differ from the base's
  const w = readWeights(out);
  const initial = readWeights(base);
  for (const [name, data] of trained) {
    assert.deepEqual(w.get(name)!.data, data, name);
  }
  assert.ok([...trained.keys()].some((n) => maxAbsDiff(initial.get(n)!.data, trained.get(n)!) > 1e-4), 'training moved the weights');
  // loaded from the directory, the model scores as the trainer's did
  const a = Model.load(out, parseModelConfig(readFileSync(join(out, 'config.json'), 'utf8')), { threads: 1, trainable: false });
  const { batch, targets } = pack(randomSeqs(rng(1), [20, 7], 32));
  const fromExport = await a.forward(batch, targets);
  const b = Model.init(modelConfig, { seed: 0, threads: 1, trainable: false });
  for (const [name, view] of b.parameters()) view.data.set(trained.get(name)!);
  const fromTrainer = await b.forward(batch, targets);
  assert.deepEqual(fromExport.logprobs, fromTrainer.logprobs);
  a.dispose();
  b.dispose();

  // an existing --out is refused and left as it was; --force replaces it; bf16 rounds
  const again = exportCli(dir, '--out', out, '--version', '1');
  assert.notEqual(again.status, 0);
  assert.match(again.stderr, /--out .* exists; choose another directory or pass --force/);
  assert.equal(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'))['torch_dtype'], 'float32');
  const forced = exportCli(dir, '--out', out, '--version', '1', '--dtype', 'bf16', '--force');
  assert.equal(forced.status, 0, forced.stderr);
  assert.equal(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'))['torch_dtype'], 'bfloat16');
  assert.ok(!existsSync(join(out, 'model.safetensors.index.json')), 'one file under the default 5 GB shard size');
  // an unknown version names the ones there are
  const missing = exportCli(dir, '--out', join(dir, 'nope'), '--version', '9');
  assert.match(missing.stderr, /--version 9: the run published versions 0, 1, 2/);
  assert.ok(!existsSync(join(dir, 'nope')));
  // damaged weights: the sha256 check refuses them and writes nothing
  const store = join(dir, 'data', 'weights');
  const file = join(store, `${summary.checksum}.safetensors`);
  const bytes = readFileSync(file);
  bytes[bytes.length - 1]! ^= 0xff;
  writeFileSync(file, bytes);
  const damaged = exportCli(dir, '--out', join(dir, 'damaged'));
  assert.notEqual(damaged.status, 0);
  assert.match(damaged.stderr, /sha256 [0-9a-f]{64} is not version 2's [0-9a-f]{64}: the file was changed or damaged; nothing written/);
  assert.ok(!existsSync(join(dir, 'damaged')));
});
