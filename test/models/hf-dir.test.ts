// Hugging Face model directories of the four families, generated tiny and random (testkit/hf-model.ts: sharded
// safetensors with the index, F32/BF16/F16, tied and untied, transformers 4 and 5 config layouts): loaded by the
// native core they give the float64 reference's log-probs, train a step and generate; damaged directories and
// configs that say something unsupported are refused naming the file, the tensor or the key, by the loader and by
// `config check`; `model.base: <dir>` is all a run config needs.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync, statSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { checkConfig } from '../../cli/run/preflight.ts';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { openWeights, readGenerationDefaults } from '../../core/weights/hf-dir.ts';
import { hfConfigJson, parseModelConfig } from '../../core/weights/model-config.ts';
import { rng } from '../../core/random.ts';
import { Model, nativeAvailable } from '../../native/index.ts';
import { referenceForward, toReferenceParams } from '../../native/reference.ts';
import { writeTinyModelDir, type TinyModelOptions } from '../../testkit/hf-model.ts';
import { maxAbsDiff, pack, randomSeqs } from '../native/helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const tmp = () => mkdtempSync(join(tmpdir(), 'rlstream-hfdir-'));

// bf16 keeps 8 bits of mantissa, f16 11: the loaded value is the written one rounded, within half an ulp
const ROUNDING = { F32: 0, BF16: 2 ** -8, F16: 2 ** -11 } as const;

const CASES: [string, TinyModelOptions][] = [
  ['llama, Llama 3.1 rope scaling (transformers 5 rope_parameters), untied, F32, 3 shards', { family: 'llama', shards: 3, v5: true, llama3Rope: { factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 }, headDim: 8 }],
  ['qwen2, q/k/v bias, tied, BF16, single file', { family: 'qwen2', tied: true, dtype: 'BF16' }],
  ['qwen3, q/k norms, head_dim 16 != hidden/heads, untied, F16, 4 shards', { family: 'qwen3', dtype: 'F16', shards: 4 }],
  ['mistral, sliding window 64, tied, BF16, 2 shards', { family: 'mistral', slidingWindow: 64, tied: true, dtype: 'BF16', shards: 2 }],
];

for (const [label, opts] of CASES) {
  test(`a ${label}: loads exactly, matches the float64 reference, trains a step and generates`, { skip, timeout: 120_000 }, async () => {
    const dir = tmp();
    try {
      const { config, tensors } = writeTinyModelDir(dir, { ...opts, tokenizer: false });
      const cfg = parseModelConfig(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')));
      assert.equal(cfg.model_type, opts.family);
      const model = Model.load(dir, cfg, { threads: 2 });
      // every tensor read back as written, up to the file's rounding; a tied head reads no lm_head
      const params = model.parameters();
      assert.equal(params.has('lm_head.weight'), !config['tie_word_embeddings']);
      for (const [name, t] of tensors) {
        const got = params.get(name)!.data;
        for (let i = 0; i < t.data.length; i++) assert.ok(Math.abs(got[i]! - t.data[i]!) <= ROUNDING[opts.dtype ?? 'F32'] * Math.abs(t.data[i]!) + 1e-7, `${name}[${i}]: ${got[i]} vs ${t.data[i]}`);
      }
      const { batch, targets, responseMask } = pack(randomSeqs(rng(5), [40, 9, 64], cfg.vocab_size));
      const out = await model.forward(batch, targets);
      const ref = referenceForward(cfg, toReferenceParams(params), batch, targets);
      assert.ok(maxAbsDiff(out.logprobs, ref.logprobs) < 1e-4, `log-probs differ by ${maxAbsDiff(out.logprobs, ref.logprobs)}`);
      // a training step moves the weights and lowers the loss on its own batch
      const before = await model.backwardCrossEntropy(batch, targets, responseMask);
      await model.adamwStep({ lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0 });
      model.zeroGrad();
      const after = await model.backwardCrossEntropy(batch, targets, responseMask);
      assert.ok(after.loss < before.loss, `loss ${before.loss} -> ${after.loss}`);
      // greedy generation through the KV cache: each step's distribution gives the chosen token the probability the
      // full forward gives it
      model.zeroGrad();
      model.kvReserve(1, 64);
      const prompt = [3, 17, 42, 5];
      let probs = await model.extend(Int32Array.of(0), Int32Array.of(prompt.length), Int32Array.from(prompt), Float32Array.of(1));
      const seq = [...prompt];
      const stepLogp: number[] = [];
      for (let i = 0; i < 12; i++) {
        const next = probs.indexOf(Math.max(...probs));
        stepLogp.push(Math.log(probs[next]!));
        seq.push(next);
        probs = await model.extend(Int32Array.of(0), Int32Array.of(1), Int32Array.of(next), Float32Array.of(1));
      }
      const whole = pack([seq]);
      const full = await model.forward(whole.batch, whole.targets);
      const fullLogp = Array.from(full.logprobs.subarray(prompt.length - 1, seq.length - 1));
      assert.ok(maxAbsDiff(stepLogp, fullLogp) < 1e-4, `decode vs full forward: ${maxAbsDiff(stepLogp, fullLogp)}`);
      model.dispose();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

function errorOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    assert.ok(isRlstreamError(err), `not an RlstreamError: ${String(err)}`);
    return (err as Error).message;
  }
  assert.fail('no error');
}

test('a damaged directory is refused naming the file and the tensor, before any weight is read', () => {
  const dir = tmp();
  try {
    const fresh = () => {
      rmSync(dir, { recursive: true, force: true });
      writeTinyModelDir(dir, { family: 'qwen3', shards: 3, tokenizer: false });
      return JSON.parse(readFileSync(join(dir, 'model.safetensors.index.json'), 'utf8')) as { metadata: { total_size: number }; weight_map: Record<string, string> };
    };
    const writeIndex = (ix: unknown) => writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify(ix));
    const shard2 = 'model-00002-of-00003.safetensors';
    // a shard gone
    fresh();
    unlinkSync(join(dir, shard2));
    assert.match(errorOf(() => openWeights(dir)), new RegExp(`cannot open .*${shard2}`));
    // a shard cut short
    fresh();
    truncateSync(join(dir, shard2), statSync(join(dir, shard2)).size - 3);
    assert.match(errorOf(() => openWeights(dir)), new RegExp(`${shard2}: tensor .* data_offsets .* fall outside|${shard2}: header length`));
    // the index names a tensor in the wrong shard, omits one, sends one outside the directory, lies about the size
    let ix = fresh();
    const [moved] = Object.entries(ix.weight_map).find(([, f]) => f === shard2)!;
    ix.weight_map[moved] = 'model-00001-of-00003.safetensors';
    writeIndex(ix);
    assert.match(errorOf(() => openWeights(dir)), new RegExp(`${shard2}: holds tensor ${moved.replace(/\./g, '\\.')}, which model.safetensors.index.json puts in model-00001`));
    ix = fresh();
    delete ix.weight_map[moved];
    writeIndex(ix);
    assert.match(errorOf(() => openWeights(dir)), /which model\.safetensors\.index\.json does not name/);
    for (const evil of ['../model-00002-of-00003.safetensors', '/etc/passwd', 'sub/x.safetensors', '.hidden.safetensors', 'x.bin']) {
      ix = fresh();
      ix.weight_map[moved] = evil;
      writeIndex(ix);
      assert.match(errorOf(() => openWeights(dir)), /is not a shard file name in the directory/, evil);
    }
    ix = fresh();
    ix.metadata.total_size += 4;
    writeIndex(ix);
    assert.match(errorOf(() => openWeights(dir)), /metadata\.total_size \d+ is not the \d+ bytes/);
    ix = fresh();
    writeFileSync(join(dir, 'model.safetensors.index.json'), '{"weight_map": [');
    assert.match(errorOf(() => openWeights(dir)), /model\.safetensors\.index\.json: /);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a directory whose tensors do not fit its config is refused by Model.load, naming the tensor', { skip }, () => {
  const dir = tmp();
  try {
    writeTinyModelDir(dir, { family: 'qwen3', shards: 2, tokenizer: false });
    const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    // the same weights read as Qwen2 (biases expected, q/k norms unexpected) and with another head width
    assert.match(errorOf(() => Model.load(dir, parseModelConfig({ ...cfg, model_type: 'qwen2', architectures: ['Qwen2ForCausalLM'], attention_bias: undefined }))), /tensor model\.layers\.0\.self_attn\.q_proj\.bias is missing/);
    assert.match(errorOf(() => Model.load(dir, parseModelConfig({ ...cfg, head_dim: 8 }))), /tensor model\.layers\.0\.self_attn\.q_proj\.weight has shape \[64, 32\], the config gives \[32, 32\]/);
    assert.match(errorOf(() => Model.load(dir, parseModelConfig({ ...cfg, model_type: 'llama', architectures: ['LlamaForCausalLM'], head_dim: 16 }))), /unexpected tensor model\.layers\.\d\.self_attn\.[qk]_norm\.weight/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

const BASE = { architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, intermediate_size: 48, vocab_size: 96, max_position_embeddings: 256, rms_norm_eps: 1e-6, rope_theta: 1e6 };

test('config keys the model cannot run as described are refused naming the key (hand-written cases)', () => {
  const bad: [Record<string, unknown>, RegExp][] = [
    [{ rope_scaling: { rope_type: 'yarn', factor: 4 } }, /rope_scaling\.rope_type "yarn" is not supported/],
    [{ rope_parameters: { rope_type: 'dynamic', rope_theta: 1e4, factor: 2 } }, /rope_parameters\.rope_type "dynamic" is not supported/],
    [{ rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, beta: 3 } }, /rope_scaling\.beta is not supported for rope_type llama3/],
    [{ rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 4, high_freq_factor: 1 } }, /need 0 < low_freq_factor < high_freq_factor/],
    [{ quantization_config: { quant_method: 'awq' } }, /quantization_config: quantized checkpoints are not supported/],
    [{ auto_map: { AutoModelForCausalLM: 'x.Model' } }, /auto_map: checkpoints with their own modeling code/],
    [{ use_qk_norm_after_rope: true }, /use_qk_norm_after_rope: unknown key/],
    [{ hidden_act: 'gelu' }, /hidden_act "gelu" is not supported/],
    [{ attention_bias: true }, /attention_bias: true is not supported for qwen3/],
    [{ attention_dropout: 0.1 }, /attention_dropout 0\.1 is not supported/],
    [{ partial_rotary_factor: 0.5 }, /partial_rotary_factor 0\.5 is not supported/],
    [{ model_type: 'gemma3' }, /model_type "gemma3" is not supported/],
    [{ architectures: ['Qwen2ForCausalLM'] }, /architectures \["Qwen2ForCausalLM"\] does not match model_type qwen3/],
    [{ architectures: ['Qwen3ForSequenceClassification'] }, /architectures .* is not supported/],
    [{ layer_types: ['full_attention', 'sliding_attention'] }, /layer_types\[1\] "sliding_attention" is not supported/],
    [{ layer_types: ['full_attention'] }, /layer_types must list num_hidden_layers \(2\) entries/],
    [{ use_sliding_window: true, sliding_window: null }, /use_sliding_window is true but sliding_window is not set/],
    [{ model_type: 'mistral', architectures: ['MistralForCausalLM'], use_sliding_window: true }, /use_sliding_window is not a Mistral key/],
    [{ model_type: 'llama', architectures: ['LlamaForCausalLM'], mlp_bias: true }, /mlp_bias true is not supported/],
    [{ model_type: 'qwen2', architectures: ['Qwen2ForCausalLM'], attention_bias: false }, /attention_bias: false is not how Qwen2 is built/],
    [{ head_dim: 15 }, /head_dim 15 must be even/],
  ];
  for (const [patch, re] of bad) assert.match(errorOf(() => parseModelConfig({ ...BASE, ...patch })), re, JSON.stringify(patch));
  // and what they mean where accepted: llama3 scaling from either layout, a sliding window where it is on
  const v4 = parseModelConfig({ ...BASE, rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 } });
  const v5 = parseModelConfig({ ...BASE, rope_theta: undefined, rope_parameters: { rope_type: 'llama3', rope_theta: 1e6, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 } });
  assert.deepEqual(v4, v5);
  assert.equal(parseModelConfig({ ...BASE, use_sliding_window: true, sliding_window: 32, layer_types: ['full_attention', 'sliding_attention'] }).sliding_window, 32);
  assert.equal(parseModelConfig({ ...BASE, use_sliding_window: false, sliding_window: 32 }).sliding_window, null);
  assert.equal(parseModelConfig({ ...BASE, rope_parameters: { rope_type: 'default', rope_theta: 5e5 } }).rope_theta, 5e5);
});

test('generated configs: every mutation of a valid config parses or is refused as CONFIG_INVALID naming a key', () => {
  const r = rng(77);
  const keys = [...Object.keys(BASE), 'rope_scaling', 'rope_parameters', 'sliding_window', 'use_sliding_window', 'layer_types', 'attention_bias', 'tie_word_embeddings', 'hidden_act', 'mlp_bias', 'torch_dtype', 'eos_token_id', 'qk_layernorm', 'rope_type', 'num_experts'];
  const values: unknown[] = [null, true, false, 0, -1, 1, 2, 3.5, 1e9, 'silu', 'llama3', 'qwen3', [], ['full_attention'], {}, { rope_type: 'llama3' }, { rope_type: 'default', rope_theta: 1e4 }, { type: 'linear', factor: 2 }, 'x'];
  let accepted = 0;
  for (let i = 0; i < 3000; i++) {
    const cfg: Record<string, unknown> = { ...BASE };
    for (let m = 0; m < 1 + Math.floor(r() * 3); m++) cfg[keys[Math.floor(r() * keys.length)]!] = values[Math.floor(r() * values.length)];
    let parsed;
    try {
      parsed = parseModelConfig(cfg);
    } catch (err) {
      assert.ok(isRlstreamError(err) && err.code === 'CONFIG_INVALID', `${JSON.stringify(cfg)}: ${String(err)}`);
      // the message names a key of the config
      assert.ok(Object.keys(cfg).some((k) => (err as Error).message.includes(k)), (err as Error).message);
      continue;
    }
    accepted++;
    // what is accepted is a model the native core can build: positive sizes, even head_dim dividing the heads
    assert.ok(parsed.head_dim % 2 === 0 && parsed.num_attention_heads % parsed.num_key_value_heads === 0);
    assert.ok(['llama', 'qwen2', 'qwen3', 'mistral'].includes(parsed.model_type));
    // and written back (hfConfigJson: how the built-in policy hands a config to its engine workers) it parses to
    // the same model, rotary scaling and sliding window included
    assert.deepEqual(parseModelConfig(JSON.stringify(hfConfigJson(parsed))), parsed, JSON.stringify(cfg));
  }
  assert.ok(accepted > 100 && accepted < 3000, `accepted ${accepted}`);
});

test('hfConfigJson round-trips every family through the one parser (hand-written cases)', () => {
  const llama3 = { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 };
  const cases: Record<string, unknown>[] = [
    { ...BASE },
    { ...BASE, rope_theta: undefined, rope_parameters: { ...llama3, rope_theta: 5e5 }, tie_word_embeddings: true },
    { ...BASE, use_sliding_window: true, sliding_window: 32 },
    { ...BASE, model_type: 'qwen2', architectures: ['Qwen2ForCausalLM'], head_dim: undefined, use_sliding_window: true, sliding_window: 48 },
    { ...BASE, model_type: 'mistral', architectures: ['MistralForCausalLM'], sliding_window: 40 },
    { ...BASE, model_type: 'llama', architectures: ['LlamaForCausalLM'], rope_scaling: llama3 },
    // rlstream's legacy Qwen2-shaped llama (q/k/v biases) is written back as the Qwen2 it is
    { ...BASE, model_type: 'llama', architectures: undefined, head_dim: undefined, attention_bias: true },
  ];
  for (const cfg of cases) {
    const parsed = parseModelConfig(JSON.parse(JSON.stringify(cfg)));
    assert.deepEqual(parseModelConfig(JSON.stringify(hfConfigJson(parsed))), parsed, JSON.stringify(cfg));
  }
  assert.equal(parseModelConfig(JSON.stringify(hfConfigJson(parseModelConfig(JSON.parse(JSON.stringify(cases[6])))))).model_type, 'qwen2');
});

test('generation_config.json gives stop ids and sampling defaults, and a bad one is refused by name', () => {
  const dir = tmp();
  try {
    writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [151645, 151643], temperature: 0.6, top_p: 0.95, top_k: 20, do_sample: true }));
    assert.deepEqual(readGenerationDefaults(dir), { eosTokenIds: [151645, 151643], temperature: 0.6, topP: 0.95, topK: 20, source: join(dir, 'generation_config.json') });
    writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: 2, do_sample: false, temperature: 0.6 }));
    assert.equal(readGenerationDefaults(dir).temperature, 0, 'do_sample false is greedy');
    writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: 'eos' }));
    assert.match(errorOf(() => readGenerationDefaults(dir)), /generation_config\.json: eos_token_id must be a token id or a list of them, got "eos"/);
    writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ top_p: 2 }));
    assert.match(errorOf(() => readGenerationDefaults(dir)), /top_p must be in \(0, 1\]/);
    unlinkSync(join(dir, 'generation_config.json'));
    assert.equal(readGenerationDefaults(dir).source, null);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('model.base: <dir> is all a config needs; config check reads its config, index and headers', { timeout: 60_000 }, async () => {
  const dir = tmp();
  try {
    const model = join(dir, 'qwen3-tiny');
    writeTinyModelDir(model, { family: 'qwen3', shards: 2 });
    const file = join(dir, 'run.yaml');
    // A run needs rows to train on (config check reads the first ones); the model comes from model.base alone.
    const row = { data_source: 'counting', prompt: [{ role: 'user', content: 'Ana has 3 pens and gets 4 more. How many?' }], reward_model: { style: 'rule', ground_truth: '7' } };
    writeFileSync(join(dir, 'train.jsonl'), `${JSON.stringify(row)}\n`);
    writeFileSync(file, 'model:\n  base: qwen3-tiny\ndataset:\n  train: train.jsonl\nlog:\n  kind: embedded\ntraces:\n  kind: none\n');
    const c = loadRunConfig(file);
    assert.deepEqual([c.model.config, c.model.tokenizer, c.model.init], [join(model, 'config.json'), model, model]);
    assert.deepEqual((await checkConfig(file, {})).problems, []);
    // config check refuses an unsupported key, naming the file and the key
    const cfgPath = join(model, 'config.json');
    const good = readFileSync(cfgPath, 'utf8');
    writeFileSync(cfgPath, JSON.stringify({ ...JSON.parse(good), rope_scaling: { rope_type: 'yarn', factor: 4 } }));
    assert.deepEqual((await checkConfig(file, {})).problems, [`model.config: ${cfgPath} is not a model configuration: model config: rope_scaling.rope_type "yarn" is not supported (default or llama3)`]);
    // ... weights that do not fit the config (another width) ...
    writeFileSync(cfgPath, JSON.stringify({ ...JSON.parse(good), intermediate_size: 40 }));
    const problems = (await checkConfig(file, {})).problems;
    assert.ok(problems.length > 0 && problems.every((p) => p.startsWith('model.init: ') && /mlp\.(gate|up|down)_proj\.weight has shape/.test(p)), problems.join('\n'));
    // ... and a damaged index
    writeFileSync(cfgPath, good);
    const ix = JSON.parse(readFileSync(join(model, 'model.safetensors.index.json'), 'utf8')) as { weight_map: Record<string, string> };
    ix.weight_map['model.norm.weight'] = '../elsewhere.safetensors';
    writeFileSync(join(model, 'model.safetensors.index.json'), JSON.stringify(ix));
    assert.match((await checkConfig(file, {})).problems.join('\n'), /model\.init: .*weight_map\["model\.norm\.weight"\] = "\.\.\/elsewhere\.safetensors" is not a shard file name/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
