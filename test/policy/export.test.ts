// The ONNX export against independent forwards: a float64 TS reference and the native core (when built), for
// Qwen2-style (q/k/v bias, untied head) and Llama-style (tied) configs with GQA; the KV-cache path against the
// full forward; padded batches against single sequences; and the export's speed at the benchmark size.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseModelConfig, type ParsedModelConfig } from '../../core/weights/model-config.ts';
import { Model, nativeAvailable } from '../../native/index.ts';
import { exportOnnx, MASKED } from '../../producers/policy/export.ts';
import { logprobMismatch } from '../../producers/policy/mismatch.ts';
import { randomWeights } from '../../producers/policy/random-weights.ts';
import { emptyKv, PolicyRunner } from '../../producers/policy/runner.ts';
import { scoreSequences } from '../../producers/policy/score.ts';
import { hasQkNorm } from '../../producers/policy/tensors.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { referenceLogprobs } from './reference.ts';

const qwen = parseModelConfig({ hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 96, vocab_size: 100, max_position_embeddings: 128, attention_bias: true, rope_theta: 1000000, rms_norm_eps: 1e-6 });
const llama = parseModelConfig({ hidden_size: 48, num_hidden_layers: 3, num_attention_heads: 6, num_key_value_heads: 6, intermediate_size: 80, vocab_size: 70, max_position_embeddings: 64, tie_word_embeddings: true, rope_theta: 10000, rms_norm_eps: 1e-5 });

const TOL = 1e-4;
const tokens = [3, 17, 42, 5, 0, 61, 9, 9, 33, 58, 1, 27];

function causalBias(n: number): Float32Array {
  const b = new Float32Array(n * n).fill(MASKED);
  for (let i = 0; i < n; i++) b.fill(0, i * n, i * n + i + 1);
  return b;
}

async function onnxAllPositions(c: ParsedModelConfig, runner: PolicyRunner, toks: number[]): Promise<Float32Array> {
  const n = toks.length;
  const out = await runner.step({ batch: 1, seq: n, inputIds: BigInt64Array.from(toks.map(BigInt)), positionIds: BigInt64Array.from(toks.map((_, i) => BigInt(i))), bias: causalBias(n), past: emptyKv(c) });
  return out.logprobs;
}

for (const [label, c] of [
  ['qwen2-style (bias, untied, GQA)', qwen],
  ['llama-style (tied, MHA)', llama],
] as const) {
  test(`ONNX log-probs match the float64 reference: ${label}`, async () => {
    const w = randomWeights(c, 11);
    const runner = await PolicyRunner.create(c, w, 1, { mode: 'all' });
    const got = await onnxAllPositions(c, runner, tokens);
    const ref = referenceLogprobs(c, w, tokens);
    let maxDiff = 0;
    for (let t = 0; t < tokens.length; t++) for (let v = 0; v < c.vocab_size; v++) maxDiff = Math.max(maxDiff, Math.abs(got[t * c.vocab_size + v]! - ref[t]![v]!));
    console.log(`${label}: max |onnx - reference| over all positions and vocab = ${maxDiff.toExponential(2)}`);
    assert.ok(maxDiff < TOL, `max diff ${maxDiff}`);
    await runner.release();
  });
}

test('ONNX log-probs match the native core forward on the same weights (1e-4)', async (t) => {
  if (!nativeAvailable()) {
    t.skip('native addon not built (npm run build:native)');
    return;
  }
  const c = qwen;
  const model = Model.init(c, { seed: 3, threads: 1 });
  // Overwrite the native init (norms 1, biases 0) with perturbed weights, so norm and bias handling is exercised.
  const w = randomWeights(c, 5);
  for (const [name, view] of model.parameters()) view.data.set(w.get(name)!.data);
  const seqs = [tokens, [7, 8, 9, 10, 11], [99, 0]];
  const flat = seqs.flat();
  const seqStarts = Int32Array.from([0, ...seqs.map((_, i) => seqs.slice(0, i + 1).reduce((s, q) => s + q.length, 0))]);
  const targets = new Int32Array(flat.length).fill(-1);
  seqs.forEach((s, i) => s.slice(1).forEach((tok, j) => (targets[seqStarts[i]! + j] = tok)));
  const native = await model.forward({ tokens: Int32Array.from(flat), seqStarts }, targets);
  const runner = await PolicyRunner.create(c, model.parameters(), 1, { mode: 'all' });
  const onnx = await scoreSequences(runner, seqs);
  const nativePerSeq = seqs.map((s, i) => native.logprobs.subarray(seqStarts[i]!, seqStarts[i]! + s.length - 1));
  const m = logprobMismatch(nativePerSeq.flatMap((a) => Array.from(a)), onnx.flatMap((a) => Array.from(a)));
  console.log(`native vs onnxruntime: ${m.count} tokens, mean |Δlogprob| ${m.meanAbs.toExponential(2)}, max ${m.maxAbs.toExponential(2)}`);
  assert.ok(m.maxAbs < TOL, `max |Δ| ${m.maxAbs}`);
  await runner.release();
  model.dispose();
});

// Qwen3 (per-head q/k norms, head_dim 12 while hidden/heads is 8) with Llama 3.1's rope scaling, in the
// transformers-5 config layout: the ONNX graph against the native core, whose gradients the float64 reference checks.
const QWEN3_JSON = { architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 12, intermediate_size: 48, vocab_size: 100, max_position_embeddings: 128, attention_bias: false, rms_norm_eps: 1e-6, rope_parameters: { rope_type: 'llama3', rope_theta: 10000, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 32 } };

test('ONNX log-probs match the native core: Qwen3 q/k norms, head_dim != hidden/heads, llama3 rope scaling', async (t) => {
  if (!nativeAvailable()) {
    t.skip('native addon not built (npm run build:native)');
    return;
  }
  const c = parseModelConfig(QWEN3_JSON);
  assert.equal(hasQkNorm(c), true);
  const model = Model.init(QWEN3_JSON as never, { seed: 3, threads: 1 });
  const w = randomWeights(c, 5);
  for (const [name, view] of model.parameters()) view.data.set(w.get(name)!.data);
  const seqs = [[...tokens, ...tokens, ...tokens, ...tokens, ...tokens], [7, 8, 9]]; // 60 positions: past the 32 of the scaling's bands
  const flat = seqs.flat();
  const seqStarts = Int32Array.from([0, seqs[0]!.length, flat.length]);
  const targets = new Int32Array(flat.length).fill(-1);
  seqs.forEach((s, i) => s.slice(1).forEach((tok, j) => (targets[seqStarts[i]! + j] = tok)));
  const native = await model.forward({ tokens: Int32Array.from(flat), seqStarts }, targets);
  const runner = await PolicyRunner.create(c, model.parameters(), 1, { mode: 'all' });
  const onnx = await scoreSequences(runner, seqs);
  const nativePerSeq = seqs.map((s, i) => native.logprobs.subarray(seqStarts[i]!, seqStarts[i]! + s.length - 1));
  const m = logprobMismatch(nativePerSeq.flatMap((a) => Array.from(a)), onnx.flatMap((a) => Array.from(a)));
  console.log(`qwen3 + llama3 rope, native vs onnxruntime: ${m.count} tokens, max |Δlogprob| ${m.maxAbs.toExponential(2)}`);
  assert.ok(m.maxAbs < TOL, `max |Δ| ${m.maxAbs}`);
  // the same check with the q/k norms left out of the graph fails: the comparison sees them
  const broken = await PolicyRunner.create({ ...c, model_type: 'llama' }, model.parameters(), 1, { mode: 'all' });
  const off = await scoreSequences(broken, seqs);
  assert.ok(logprobMismatch(nativePerSeq.flatMap((a) => Array.from(a)), off.flatMap((a) => Array.from(a))).maxAbs > 100 * TOL);
  await broken.release();
  await runner.release();
  model.dispose();
});

test('prefill + KV-cache decode steps give the same log-probs as the full forward', async () => {
  const c = qwen;
  const w = randomWeights(c, 2);
  const all = await PolicyRunner.create(c, w, 1, { mode: 'all' });
  const last = await PolicyRunner.create(c, w, 1, { mode: 'last' });
  const full = await onnxAllPositions(c, all, tokens);
  const V = c.vocab_size;
  const k = 5;
  let out = await last.step({ batch: 1, seq: k, inputIds: BigInt64Array.from(tokens.slice(0, k).map(BigInt)), positionIds: BigInt64Array.from([0, 1, 2, 3, 4].map(BigInt)), bias: causalBias(k), past: emptyKv(c) });
  let maxDiff = 0;
  const compare = (pos: number, lp: Float32Array) => {
    for (let v = 0; v < V; v++) maxDiff = Math.max(maxDiff, Math.abs(lp[v]! - full[pos * V + v]!));
  };
  compare(k - 1, out.logprobs);
  for (let p = k; p < tokens.length; p++) {
    out = await last.step({ batch: 1, seq: 1, inputIds: BigInt64Array.from([BigInt(tokens[p]!)]), positionIds: BigInt64Array.from([BigInt(p)]), bias: new Float32Array(p + 1), past: out.present });
    assert.equal(out.present.len, p + 1);
    compare(p, out.logprobs);
  }
  console.log(`incremental vs full: max diff ${maxDiff.toExponential(2)}`);
  assert.ok(maxDiff < TOL);
  await all.release();
  await last.release();
});

test('a padded batch of different lengths scores each sequence as it would alone', async () => {
  const c = qwen;
  const w = randomWeights(c, 4);
  const runner = await PolicyRunner.create(c, w, 1, { mode: 'all' });
  const seqs = [tokens, [1, 2, 3], [50, 51, 52, 53, 54, 55, 56]];
  const batched = await scoreSequences(runner, seqs);
  for (let i = 0; i < seqs.length; i++) {
    const [alone] = await scoreSequences(runner, [seqs[i]!]);
    assert.ok(logprobMismatch(batched[i]!, alone!).maxAbs < 1e-5, `sequence ${i}`);
  }
  await runner.release();
});

test('export rejects weights that do not fit the config, and is fast at the 2M benchmark size', async () => {
  const w = randomWeights(qwen, 1);
  w.delete('model.layers.1.mlp.up_proj.weight');
  assert.throws(() => exportOnnx(qwen, w), (e: unknown) => isRlstreamError(e, 'WEIGHTS_FORMAT') && /up_proj/.test(e.message));
  const w2 = randomWeights(qwen, 1);
  w2.set('model.norm.weight', { shape: [65], data: new Float32Array(65) });
  assert.throws(() => exportOnnx(qwen, w2), (e: unknown) => isRlstreamError(e, 'WEIGHTS_FORMAT') && /model\.norm\.weight has shape \[65\]/.test(e.message));

  const bench = parseModelConfig({ hidden_size: 128, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 384, vocab_size: 512, max_position_embeddings: 1024 });
  const bw = randomWeights(bench, 1);
  exportOnnx(bench, bw); // warm-up (JIT)
  const t0 = performance.now();
  const bytes = exportOnnx(bench, bw);
  console.log(`export of the benchmark model: ${(performance.now() - t0).toFixed(1)} ms, ${(bytes.length / 1e6).toFixed(2)} MB`);
  assert.ok(bytes.length > 4 * 700_000);
});

// Operators of the default ONNX domain with a tensor(float) kernel in onnxruntime's CUDA execution provider
// for opset 17, from onnxruntime's docs/OperatorKernels.md (the table generated from the registered kernels).
// No CUDA build of onnxruntime can run here or on the borrowed GPU machine, so this is the check that the
// graphs stay within what the CUDA provider runs: an operator added to the export must be looked up there
// (a contrib operator of another domain, or one with CPU kernels only, would put the graph on the CPU).
const CUDA_FLOAT_OPS_OPSET_17 = new Set(['Add', 'Concat', 'Div', 'Gather', 'LogSoftmax', 'MatMul', 'Mul', 'Pow', 'ReduceMean', 'ReduceSum', 'Reshape', 'Shape', 'Sigmoid', 'Slice', 'Softmax', 'Split', 'Sqrt', 'Transpose', 'Unsqueeze']);

test('every exported graph uses default-domain opset-17 operators that the CUDA provider implements for float', async () => {
  const { default: onnxProto } = await import('onnx-proto');
  for (const c of [qwen, llama]) {
    for (const mode of ['last', 'all', 'decode'] as const) {
      const model = onnxProto.onnx.ModelProto.decode(exportOnnx(c, randomWeights(c, 1), mode));
      assert.deepEqual(model.opsetImport.map((o) => [o.domain ?? '', Number(o.version)]), [['', 17]], `${mode}: one opset import, ai.onnx 17`);
      const used = new Set(model.graph!.node!.map((n) => `${n.domain ? `${n.domain}.` : ''}${n.opType}`));
      const outside = [...used].filter((op) => !CUDA_FLOAT_OPS_OPSET_17.has(op));
      assert.deepEqual(outside, [], `${mode}: operators outside the CUDA provider's float kernels`);
      assert.ok(used.has('MatMul') && used.has('Softmax'), `${mode}: the graph was read (${[...used].join(' ')})`);
    }
  }
});
