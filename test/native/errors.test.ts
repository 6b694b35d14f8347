// Every error path of the native surface gives an RlstreamError with a precise message and the process lives:
// bad shapes and types, NaN/Inf inputs, ids out of range, bad packing, configs that do not add up, bad options,
// non-finite losses and gradients, malformed weight files, and the raw addon called without the TS checks.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { isRlstreamError, type ErrorCode } from '../../core/errors.ts';
import { Model, nativeAvailable, parseModelConfig, type PolicyLossInputs } from '../../native/index.ts';
import { TINY, pack } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';

function rejects(code: ErrorCode, pattern: RegExp): (e: unknown) => boolean {
  return (e: unknown) => {
    assert.ok(isRlstreamError(e, code), `expected RlstreamError ${code}, got ${String(e)}`);
    assert.match(e.message, pattern);
    return true;
  };
}

test('configs that do not add up are rejected naming the field', () => {
  const bad: [Record<string, unknown>, RegExp][] = [
    [{ ...TINY, hidden_size: 10 }, /hidden_size \(10\) is not divisible by num_attention_heads \(4\)/],
    [{ ...TINY, num_key_value_heads: 3 }, /num_attention_heads \(4\) is not divisible by num_key_value_heads \(3\)/],
    [{ ...TINY, vocab_size: 0 }, /vocab_size must be a positive integer, got 0/],
    [{ ...TINY, intermediate_size: 2.5 }, /intermediate_size must be a positive integer/],
    [{ ...TINY, rms_norm_eps: -1 }, /rms_norm_eps must be in \(0, 1\)/],
    [{ ...TINY, rope_theta: 'x' }, /rope_theta must be a finite number/],
    [{ ...TINY, tie_word_embeddings: 'yes' }, /tie_word_embeddings must be a boolean/],
    [{ ...TINY, hidden_size: 12, num_attention_heads: 4 }, /head_dim 3 must be even/],
    [{ ...TINY, hidden_size: 10 }, /hidden_size \(10\) is not divisible by num_attention_heads \(4\); set head_dim/],
    [{ ...TINY, head_dim: 7 }, /head_dim 7 must be even/],
    [{ ...TINY, rope_scaling: { type: 'linear', factor: 2 } }, /rope_scaling.rope_type "linear" is not supported/],
    [{ ...TINY, max_position_embeddings: undefined }, /max_position_embeddings is missing/],
  ];
  for (const [cfg, re] of bad) assert.throws(() => parseModelConfig(cfg), rejects('CONFIG_INVALID', re));
  assert.throws(() => parseModelConfig(42), rejects('CONFIG_INVALID', /must be a JSON object/));
  assert.throws(() => parseModelConfig('[1]'), rejects('CONFIG_INVALID', /must be a JSON object/));
  assert.throws(() => parseModelConfig('{oops'), rejects('CONFIG_INVALID', /config.json is not valid JSON/));
  // HF configs carry many other keys: ignored; num_key_value_heads defaults to the number of heads
  const cfg = parseModelConfig({ ...TINY, num_key_value_heads: undefined, model_type: 'qwen2', hidden_act: 'silu', torch_dtype: 'bfloat16' });
  assert.equal(cfg.num_key_value_heads, TINY.num_attention_heads);
  // Qwen2 configs have no attention_bias key but the model has q/k/v biases
  assert.equal(parseModelConfig({ ...TINY, attention_bias: undefined, model_type: 'qwen2' }).attention_bias, true);
  assert.equal(parseModelConfig({ ...TINY, attention_bias: undefined, model_type: 'llama' }).attention_bias, false);
});

test('the native config check catches what bypasses parseModelConfig', { skip }, async () => {
  const addon = createRequire(import.meta.url)('../../native/build/Release/rlstream_native.node') as {
    NativeModel: new (c: unknown, o: unknown) => { forward(...a: unknown[]): Promise<void> };
  };
  const attempt = (cfg: unknown, opts: unknown = { threads: 1, random: true, seed: 1, initStd: 0.02 }): unknown => {
    try {
      new addon.NativeModel(cfg, opts);
    } catch (e) {
      return e;
    }
    return undefined;
  };
  const e1 = attempt({ ...TINY, num_key_value_heads: 3 }) as Error & { code?: string };
  assert.equal(e1.code, 'NATIVE_INVALID_ARGUMENT');
  assert.match(e1.message, /config.num_attention_heads \(4\) is not divisible by config.num_key_value_heads \(3\)/);
  assert.match(String((attempt({ ...TINY, vocab_size: NaN }) as Error).message), /config.vocab_size must be an integer/);
  assert.match(String((attempt(null) as Error).message), /config must be an object/);
  assert.match(String((attempt(TINY, { threads: 0 }) as Error).message), /threads must be in \[1, 256\]/);
  // a raw call with wrong argument types rejects instead of crashing
  const m = new addon.NativeModel(TINY, { threads: 1, random: false });
  // without the TS queue, a second call while one runs is rejected by the addon itself
  const toks = new Int32Array(150);
  const first = m.forward(toks, Int32Array.from([0, 150]), new Int32Array(150), new Float32Array(150), new Float32Array(150));
  assert.throws(() => m.forward(toks, Int32Array.from([0, 150]), new Int32Array(150), new Float32Array(150), new Float32Array(150)), /another call on this model is still running/);
  await first;
  assert.throws(() => m.forward(new Float32Array(3), new Int32Array([0, 3]), new Int32Array(3), new Float32Array(3), new Float32Array(3)), /batch.tokens must be a Int32Array/);
  assert.throws(() => m.forward(), /batch.tokens must be a Int32Array/);
});

test('bad batches, shapes, ids and NaN inputs reject with precise messages', { skip }, async () => {
  const model = Model.init(TINY, { seed: 1, threads: 2 });
  const { batch, targets, responseMask } = pack([[1, 2, 3, 4], [5, 6, 7]]);
  const INV = 'NATIVE_INVALID_ARGUMENT';
  await assert.rejects(model.forward({ tokens: Int32Array.from([1, 2, 11, 4, 5, 6, 7]), seqStarts: batch.seqStarts }, targets), rejects(INV, /batch.tokens\[2\] = 11 is out of range \[0, 11\)/));
  await assert.rejects(model.forward({ tokens: Int32Array.from([1, 2, -3, 4, 5, 6, 7]), seqStarts: batch.seqStarts }, targets), rejects(INV, /batch.tokens\[2\] = -3/));
  await assert.rejects(model.forward(batch, Int32Array.from([2, 3, 4, 99, 6, 7, -1])), rejects(INV, /targets\[3\] = 99 is out of range/));
  await assert.rejects(model.forward(batch, new Int32Array(6)), rejects(INV, /targets has length 6, expected 7/));
  await assert.rejects(model.forward({ tokens: batch.tokens, seqStarts: Int32Array.from([0, 4, 6]) }, targets), rejects(INV, /seqStarts must end at the number of tokens 7, got 6/));
  await assert.rejects(model.forward({ tokens: batch.tokens, seqStarts: Int32Array.from([0, 4, 4, 7]) }, targets), rejects(INV, /strictly increasing/));
  await assert.rejects(model.forward({ tokens: batch.tokens, seqStarts: Int32Array.from([1, 7]) }, targets), rejects(INV, /seqStarts\[0\] must be 0/));
  await assert.rejects(model.forward({ tokens: batch.tokens, seqStarts: Int32Array.from([7]) }, targets), rejects(INV, /at least 2 entries/));
  await assert.rejects(model.forward({ tokens: new Int32Array(0), seqStarts: Int32Array.from([0]) }, new Int32Array(0)), rejects(INV, /at least 2 entries|empty/));
  await assert.rejects(model.forward({ tokens: Array.from(batch.tokens) as unknown as Int32Array, seqStarts: batch.seqStarts }, targets), rejects(INV, /batch.tokens must be a Int32Array/));
  const long = new Int32Array(161);
  await assert.rejects(model.forward({ tokens: long, seqStarts: Int32Array.from([0, 161]) }, new Int32Array(161)), rejects(INV, /sequence 0 has length 161 > max_position_embeddings 160/));

  await assert.rejects(model.backwardCrossEntropy(batch, targets, new Float32Array(7).fill(1)), rejects(INV, /targets\[3\] is -1 where response_mask\[3\] is not 0/));
  const nanMask = Float32Array.from(responseMask);
  nanMask[1] = NaN;
  await assert.rejects(model.backwardCrossEntropy(batch, targets, nanMask), rejects('NATIVE_NON_FINITE', /mask\[1\] is NaN/));
  await assert.rejects(model.backwardCrossEntropy(batch, targets, responseMask, { lossScale: Infinity }), rejects('NATIVE_NON_FINITE', /lossScale must be finite/));

  const T = 7;
  const inputs: PolicyLossInputs = { targets, responseMask, advantages: new Float32Array(T), behaviourLogprobs: new Float32Array(T).fill(-2) };
  const opts = { clipLow: 0.2, clipHigh: 0.2 };
  const adv = new Float32Array(T);
  adv[5] = Infinity;
  await assert.rejects(model.backwardPolicyLoss(batch, { ...inputs, advantages: adv }, opts), rejects('NATIVE_NON_FINITE', /inputs.advantages\[5\] is infinite/));
  const prox = new Float32Array(T);
  prox[0] = NaN;
  await assert.rejects(model.backwardPolicyLoss(batch, { ...inputs, proximalLogprobs: prox }, opts), rejects('NATIVE_NON_FINITE', /inputs.proximalLogprobs\[0\] is NaN/));
  await assert.rejects(model.backwardPolicyLoss(batch, { ...inputs, refLogprobs: new Float32Array(3) }, opts), rejects(INV, /inputs.refLogprobs has length 3, expected 7/));
  await assert.rejects(model.backwardPolicyLoss(batch, inputs, { ...opts, klCoef: 0.1 }), rejects(INV, /klCoef is not 0 but inputs.refLogprobs is missing/));
  assert.throws(() => model.backwardPolicyLoss(batch, inputs, { ...opts, dualClipC: 0.5 }), rejects(INV, /dualClipC must be > 1/));
  assert.throws(() => model.backwardPolicyLoss(batch, inputs, { ...opts, clipLow: 1.5 }), rejects(INV, /clipLow must be in \[0, 1\)/));
  assert.throws(() => model.backwardPolicyLoss(batch, inputs, { ...opts, aggregation: 'sum' as never }), rejects(INV, /aggregation must be/));
  assert.throws(() => model.backwardPolicyLoss(batch, inputs, { ...opts, klType: 'k4' as never }), rejects(INV, /klType must be/));
  assert.throws(() => model.backwardPolicyLoss(batch, inputs, { ...opts, iwCap: -1 }), rejects(INV, /iwCap must be > 0/));
  await assert.rejects(model.adamwStep({ lr: 1e-3, beta1: 1, beta2: 0.9, eps: 1e-8, weightDecay: 0 }), rejects(INV, /beta1 must be in \[0, 1\)/));
  assert.throws(() => model.clipGradNorm(0), rejects(INV, /maxNorm must be > 0/));
  // nothing above touched the gradients or the step
  assert.equal(model.gradNorm(), 0);
  assert.equal(model.step, 0);
  // the model still works after all that
  const ok = await model.forward(batch, targets);
  assert.ok(ok.logprobs.every(Number.isFinite));
  model.dispose();
  await assert.rejects(model.forward(batch, targets), rejects(INV, /disposed/));
});

test('a model larger than the machine is refused with an error, not an OOM kill', { skip }, () => {
  const huge = { ...TINY, hidden_size: 16384, num_attention_heads: 128, num_key_value_heads: 8, vocab_size: 4_000_000 };
  assert.throws(() => Model.init(huge, { seed: 1, threads: 1 }), rejects('NATIVE_INVALID_ARGUMENT', /parameters, gradients and AdamW state need [0-9.]+ GiB, more than this machine/));
});

test('a model with non-finite weights gives NATIVE_NON_FINITE for the loss and the gradient norm', { skip }, async () => {
  const model = Model.init(TINY, { seed: 1, threads: 2 });
  const { batch, targets, responseMask } = pack([[1, 2, 3, 4]]);
  model.parameters().get('model.norm.weight')!.data[0] = Infinity;
  await assert.rejects(model.backwardCrossEntropy(batch, targets, responseMask), rejects('NATIVE_NON_FINITE', /cross-entropy loss is not finite/));
  assert.throws(() => model.clipGradNorm(1), rejects('NATIVE_NON_FINITE', /gradient norm is not finite/));
  model.dispose();
});

test('malformed or mismatched weight files give WEIGHTS_FORMAT errors', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-native-'));
  try {
    const m = Model.init(TINY, { seed: 1, threads: 1 });
    const good = join(dir, 'good.safetensors');
    await m.save(good);
    assert.throws(() => Model.load(good, { ...TINY, intermediate_size: 16 }), rejects('WEIGHTS_FORMAT', /mlp.gate_proj.weight has shape \[12, 8\], the config gives \[16, 8\]/));
    assert.throws(() => Model.load(good, { ...TINY, num_hidden_layers: 3 }), rejects('WEIGHTS_FORMAT', /model.layers.2.input_layernorm.weight is missing/));
    assert.throws(() => Model.load(good, { ...TINY, num_hidden_layers: 1 }), rejects('WEIGHTS_FORMAT', /unexpected tensor model.layers.1/));
    assert.throws(() => Model.load(join(dir, 'absent.safetensors'), TINY), rejects('WEIGHTS_FORMAT', /cannot open/));
    writeFileSync(join(dir, 'short.safetensors'), Buffer.from([1, 2, 3]));
    assert.throws(() => Model.load(join(dir, 'short.safetensors'), TINY), rejects('WEIGHTS_FORMAT', /shorter than the 8-byte header length/));
    const hdr = Buffer.from('{not json');
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(hdr.length));
    writeFileSync(join(dir, 'json.safetensors'), Buffer.concat([len, hdr]));
    assert.throws(() => Model.load(join(dir, 'json.safetensors'), TINY), rejects('WEIGHTS_FORMAT', /header is not valid UTF-8 JSON/));
    m.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a model made for inference only generates and reads its weights; every training call is refused by name', { skip }, async () => {
  const full = Model.init(TINY, { seed: 4, threads: 1 });
  const lean = Model.init(TINY, { seed: 4, threads: 1, trainable: false });
  try {
    assert.equal(lean.numParameters, full.numParameters);
    for (const [name, t] of full.parameters()) assert.deepEqual(lean.parameters().get(name)!.data, t.data, name);
    const { batch, targets, responseMask } = pack([[1, 2, 3, 4, 5]]);
    assert.deepEqual((await lean.forward(batch, targets)).logprobs, (await full.forward(batch, targets)).logprobs);
    // It generates what the trainable model generates (its layers share one set of activations: no backward reads
    // them), a prefill of two slots and decode steps alike
    for (const m of [lean, full]) m.kvReserve(2, 16);
    const steps: [number[], number[], number[]][] = [[[0, 1], [3, 4], [1, 2, 3, 9, 8, 7, 6]], [[0, 1], [1, 1], [5, 4]], [[1, 0], [1, 1], [2, 3]]];
    for (const [slots, counts, tokens] of steps) {
      const [a, b] = await Promise.all([lean, full].map((m) => m.extend(Int32Array.from(slots), Int32Array.from(counts), Int32Array.from(tokens))));
      assert.equal(a!.length, 2 * TINY.vocab_size);
      assert.deepEqual(a, b);
    }
    // and holds one layer's activations: only the residual streams grow with the layers
    const T = 64;
    const layers = (n: number, trainable: boolean) => {
      const m = Model.init({ ...TINY, num_hidden_layers: n }, { seed: 1, threads: 1, trainable });
      const bytes = m.activationBytes(T);
      m.dispose();
      return bytes;
    };
    assert.equal(layers(3, false) - layers(1, false), 2 * T * TINY.hidden_size * 4);
    assert.ok(layers(3, true) - layers(1, true) > 8 * T * TINY.hidden_size * 4, 'a trainable model keeps every layer\'s activations');
    const refused = rejects('NATIVE_INVALID_ARGUMENT', /made for inference \(parameters only\): it has no gradients or optimizer state/);
    await assert.rejects(lean.backwardCrossEntropy(batch, targets, responseMask), refused);
    assert.throws(() => lean.zeroGrad(), refused);
    assert.throws(() => lean.gradNorm(), refused);
    assert.throws(() => lean.gradients(), refused);
    assert.throws(() => lean.optimizerState(), refused);
    await assert.rejects(lean.adamwStep({ lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0 }), refused);
    // The weights still move between models: a trainer's copy into a generation-only model.
    lean.copyParamsFrom(full);
  } finally {
    full.dispose();
    lean.dispose();
  }
});
