// Export a Llama/Qwen2 decoder (config + HF-named weights) to an ONNX graph with an explicit KV cache, for
// onnxruntime. Standard opset-17 operators only, so the CPU and CUDA providers both run it.
//
// Inputs:   input_ids       int64 [batch, seq]
//           position_ids    int64 [batch, seq]            (real positions; rotary embeddings use them)
//           past_bias       float [batch, 1, seq, past]   (additive over the cached columns: 0 = attend, -1e9 = masked)
//           new_bias        float [batch, 1, seq, seq]    (additive over the new tokens, e.g. causal)
//           past_key_values.N.key / .value  float [batch, kv_heads, past, head_dim]   (keys already rotated)
// Outputs:  logprobs        float [batch, vocab] (mode 'last': the last position of each row)
//                           or [batch, seq, vocab] (mode 'all', for parity tests)
//           new_key_values.N.key / .value  float [batch, kv_heads, seq, head_dim]  (only the new tokens' K/V)
// Attention is split into a part over the cache and a part over the new tokens, joined only at the scores
// (one softmax over both). The graph never concatenates past and new K/V: the cache stays in buffers the
// engine owns and reuses (fixed capacity, extra columns masked by past_bias), and each step writes back only
// the new tokens' K/V. A present = concat(past, new) output would copy the whole cache on every decode step,
// which was the largest cost at batch 64 (see bench/policy.ts).
// Mode 'decode' is the same model for exactly one new token per row (seq = 1, no new_bias: the token attends
// to itself): its new-token attention is elementwise instead of B×kv_heads tiny matrix products, and heads
// are split by Reshape instead of Transpose. The engine runs it for every decode step.
// The additive biases instead of HF's 0/1 mask let the engine describe any layout (left padding, unused
// capacity, holes left by merged batches, causal prefill) with no mask logic in the graph.
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { checkWeights, lmHead, type ModelConfig } from './config.ts';
import { GraphBuilder, type Dim } from './onnx-graph.ts';

export type OutputMode = 'last' | 'all' | 'decode';

export const OPSET = 17;
export const MASKED = -1e9;
// Slice clamps ends to the dimension; the largest exactly representable integer is enough.
const INT64_MAX = Number.MAX_SAFE_INTEGER;

export function pastKeyName(layer: number): string {
  return `past_key_values.${layer}.key`;
}
export function pastValueName(layer: number): string {
  return `past_key_values.${layer}.value`;
}
export function newKeyName(layer: number): string {
  return `new_key_values.${layer}.key`;
}
export function newValueName(layer: number): string {
  return `new_key_values.${layer}.value`;
}

function transpose(w: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    const base = r * cols;
    for (let c = 0; c < cols; c++) out[c * rows + r] = w[base + c]!;
  }
  return out;
}

/**
 * Rotary tables in HF-Llama layout (cos/sin of [freqs, freqs]), computed in float64 for accuracy; the sin table
 * has its first half negated so rotate_half(x) * sin becomes swap_halves(x) * sinSigned (no Neg node).
 */
export function ropeTables(c: ModelConfig): { cos: Float32Array; sinSigned: Float32Array } {
  const D = c.headDim;
  const half = D / 2;
  const cos = new Float32Array(c.maxPositions * D);
  const sinSigned = new Float32Array(c.maxPositions * D);
  for (let p = 0; p < c.maxPositions; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p / Math.pow(c.ropeTheta, (2 * i) / D);
      const cs = Math.cos(angle);
      const sn = Math.sin(angle);
      cos[p * D + i] = cs;
      cos[p * D + half + i] = cs;
      sinSigned[p * D + i] = -sn;
      sinSigned[p * D + half + i] = sn;
    }
  }
  return { cos, sinSigned };
}

/** Build and encode the ONNX model. Throws WEIGHTS_FORMAT when a tensor is missing or mis-shaped. */
export function exportOnnx(c: ModelConfig, weights: TensorMap, mode: OutputMode = 'last'): Uint8Array {
  checkWeights(c, weights);
  const g = new GraphBuilder();
  const E = c.hiddenSize;
  const H = c.numHeads;
  const KVH = c.numKvHeads;
  const D = c.headDim;
  const G = H / KVH;
  const I = c.intermediateSize;
  const V = c.vocabSize;
  const w = (name: string) => weights.get(name)!.data;
  // HF stores Linear weights as [out, in]; MatMul wants [in, out].
  const linear = (x: string, name: string, outDim: number, inDim: number, bias?: string): string => {
    const y = g.op('MatMul', [x, g.weight(name + '.T', [inDim, outDim], transpose(w(name), outDim, inDim))]);
    return bias && weights.has(bias) ? g.op('Add', [y, g.weight(bias, [outDim], w(bias))]) : y;
  };
  const eps = g.scalar(c.rmsNormEps);
  const rmsNorm = (x: string, weightName: string): string => {
    // Pow(x, 2) rather than x * x: onnxruntime fuses this exact pattern into one SimplifiedLayerNormalization.
    const ms = g.op('ReduceMean', [g.op('Pow', [x, g.scalar(2)])], { axes: [-1], keepdims: 1 });
    const normed = g.op('Div', [x, g.op('Sqrt', [g.op('Add', [ms, eps])])]);
    return g.op('Mul', [normed, g.weight(weightName, [E], w(weightName))]);
  };

  const decode = mode === 'decode';
  const S: Dim = decode ? 1 : 'seq';
  const ids = g.input('input_ids', 'int64', ['batch', S]);
  const pos = g.input('position_ids', 'int64', ['batch', S]);
  const pastBias = g.input('past_bias', 'float', ['batch', 1, S, 'past']);
  const newBias = decode ? '' : g.input('new_bias', 'float', ['batch', 1, 'seq', 'seq']);

  const { cos, sinSigned } = ropeTables(c);
  const unsq1 = g.ints([1]);
  const cosB = g.op('Unsqueeze', [g.op('Gather', [g.weight('rope.cos', [c.maxPositions, D], cos), pos], { axis: 0 }), unsq1]);
  const sinB = g.op('Unsqueeze', [g.op('Gather', [g.weight('rope.sin_signed', [c.maxPositions, D], sinSigned), pos], { axis: 0 }), unsq1]);
  const lastAxis = g.ints([-1]);
  const firstHalf = [g.ints([0]), g.ints([D / 2]), lastAxis];
  const secondHalf = [g.ints([D / 2]), g.ints([D]), lastAxis];
  const rope = (x: string, out?: string): string => {
    const swapped = g.op('Concat', [g.op('Slice', [x, ...secondHalf]), g.op('Slice', [x, ...firstHalf])], { axis: -1 });
    return g.op('Add', [g.op('Mul', [x, cosB]), g.op('Mul', [swapped, sinB])], {}, out);
  };
  // Grouped-query attention without repeating K/V: the G query heads that share a KV head are stacked along
  // the sequence axis ([B, KVH, G*S, D]), so the additive biases are tiled G times along that axis once.
  const tileG = (b: string) => (G === 1 ? b : g.op('Concat', Array.from({ length: G }, () => b), { axis: 2 }));
  const pastBiasG = tileG(pastBias);
  const newBiasG = decode ? '' : tileG(newBias);
  const keysT = (k: string) => g.op('Transpose', [k], { perm: [0, 1, 3, 2] });
  const zero = g.ints([0]);
  const end = g.ints([INT64_MAX]);
  let pastLen = '';
  const scale = g.scalar(1 / Math.sqrt(D));
  // [B, S, heads*D] → [B, heads, S, D]; with S = 1 both layouts are the same bytes, so a Reshape does it.
  const toHeads = (x: string, heads: number, out?: string) =>
    decode ? g.op('Reshape', [x, g.ints([0, heads, 1, D])], {}, out) : g.op('Transpose', [g.op('Reshape', [x, g.ints([0, 0, heads, D])])], { perm: [0, 2, 1, 3] }, out);

  let x = g.op('Gather', [g.weight('model.embed_tokens.weight', [V, E], w('model.embed_tokens.weight')), ids], { axis: 0 });
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    g.input(pastKeyName(l), 'float', ['batch', KVH, 'past', D]);
    g.input(pastValueName(l), 'float', ['batch', KVH, 'past', D]);
    if (l === 0) pastLen = g.op('Shape', [pastKeyName(0)], { start: 2, end: 3 });
    const h = rmsNorm(x, p + 'input_layernorm.weight');
    const q = rope(toHeads(linear(h, p + 'self_attn.q_proj.weight', H * D, E, p + 'self_attn.q_proj.bias'), H));
    const k = rope(toHeads(linear(h, p + 'self_attn.k_proj.weight', KVH * D, E, p + 'self_attn.k_proj.bias'), KVH), newKeyName(l));
    const v = toHeads(linear(h, p + 'self_attn.v_proj.weight', KVH * D, E, p + 'self_attn.v_proj.bias'), KVH, newValueName(l));
    g.output(newKeyName(l), ['batch', KVH, S, D]);
    g.output(newValueName(l), ['batch', KVH, S, D]);
    const qg = g.op('Reshape', [g.op('Mul', [q, scale]), g.ints([0, KVH, -1, D])]);
    const scoresPast = g.op('Add', [g.op('MatMul', [qg, keysT(pastKeyName(l))]), pastBiasG]);
    // One new token (decode): its score and its share of the context are elementwise products, not B×KVH
    // tiny matrix products (whose per-call overhead dominated batch-64 steps).
    const scoresNew = decode ? g.op('ReduceSum', [g.op('Mul', [qg, k]), lastAxis], { keepdims: 1 }) : g.op('Add', [g.op('MatMul', [qg, keysT(k)]), newBiasG]);
    const probs = g.op('Softmax', [g.op('Concat', [scoresPast, scoresNew], { axis: -1 })], { axis: -1 });
    const probsPast = g.op('Slice', [probs, zero, pastLen, lastAxis]);
    const probsNew = g.op('Slice', [probs, pastLen, end, lastAxis]);
    const ctx = g.op('Add', [g.op('MatMul', [probsPast, pastValueName(l)]), decode ? g.op('Mul', [probsNew, v]) : g.op('MatMul', [probsNew, v])]);
    const merged = decode
      ? g.op('Reshape', [ctx, g.ints([0, 1, H * D])])
      : g.op('Reshape', [g.op('Transpose', [g.op('Reshape', [ctx, g.ints([0, H, -1, D])])], { perm: [0, 2, 1, 3] }), g.ints([0, 0, H * D])]);
    x = g.op('Add', [x, linear(merged, p + 'self_attn.o_proj.weight', E, H * D)]);
    const h2 = rmsNorm(x, p + 'post_attention_layernorm.weight');
    const gate = linear(h2, p + 'mlp.gate_proj.weight', I, E);
    const act = g.op('Mul', [g.op('Mul', [gate, g.op('Sigmoid', [gate])]), linear(h2, p + 'mlp.up_proj.weight', I, E)]);
    x = g.op('Add', [x, linear(act, p + 'mlp.down_proj.weight', E, I)]);
  }
  if (mode === 'last') x = g.op('Slice', [x, g.ints([-1]), g.ints([INT64_MAX]), g.ints([1])]);
  const normed = rmsNorm(x, 'model.norm.weight');
  const logits = g.op('MatMul', [normed, g.weight('lm_head.T', [E, V], transpose(lmHead(c, weights), V, E))]);
  if (mode !== 'all') {
    g.op('LogSoftmax', [g.op('Reshape', [logits, g.ints([-1, V])])], { axis: -1 }, 'logprobs');
    g.output('logprobs', ['batch', V]);
  } else {
    g.op('LogSoftmax', [logits], { axis: -1 }, 'logprobs');
    g.output('logprobs', ['batch', 'seq', V]);
  }
  return g.encode('rlstream_policy', OPSET);
}

/** The config's dimensions as numbers the engine needs for KV bookkeeping. */
export function kvFloatsPerToken(c: ModelConfig): number {
  return c.numLayers * 2 * c.numKvHeads * c.headDim;
}
