// Export a Llama/Qwen2 decoder (config + HF-named weights) to an ONNX graph with an explicit KV cache, for
// onnxruntime. Standard opset-17 operators only, so the CPU and CUDA providers both run it (a test checks them
// against the CUDA provider's kernel table).
//
// Inputs:   input_ids       int64 [batch, seq]
//           position_ids    int64 [batch, seq]            (real positions; rotary embeddings use them)
//           past_bias       float [batch, 1, seq, past]   (additive over the cached columns: 0 = attend, -1e9 = masked)
//           new_bias        float [batch, 1, seq, seq]    (additive over the new tokens, e.g. causal)
//           past_key_values.N.key / .value  float [batch, kv_heads, past, head_dim]   (keys already rotated)
//           inv_temperature float [batch, 1]              (modes 'last' and 'decode': 1 / T per row)
// Outputs:  probs           float [batch, vocab]  (modes 'last' and 'decode': softmax(logits / T) at the last position)
//           logprobs        float [batch, vocab]  (mode 'last': log_softmax(logits), T = 1)
//                           or [batch, seq, vocab] (mode 'all': every position, for scoring and parity tests)
//           new_key_values.N.key / .value  float [batch, kv_heads, seq, head_dim]  (only the new tokens' K/V)
//           new_key_values  float [batch, layers * 2 * kv_heads, 1, head_dim]  (mode 'decode' instead of the above:
//                           the one new token's K and V of every layer in one output, fewer tensors to fetch)
// Attention is split into a part over the cache and a part over the new tokens, joined only at the scores
// (one softmax over both). The graph never concatenates past and new K/V: the cache stays in buffers the
// engine owns and reuses (fixed capacity, extra columns masked by past_bias), and each step writes back only
// the new tokens' K/V. A present = concat(past, new) output would copy the whole cache on every decode step,
// a cost that grows with batch and context (bench/policy.ts measures decode steps).
// Mode 'decode' is the same model for exactly one new token per row (seq = 1, no new_bias: the token attends
// to itself): its new-token attention is elementwise instead of B×kv_heads tiny matrix products, and heads
// are split by Reshape instead of Transpose. The engine runs it for every decode step.
// Per layer, q and k come from one MatMul and v from another, rotary embeddings need no Slice/Concat (see
// qkWeights), and gate and up are two MatMuls: one product per output that is used apart, because a Split
// after a joint product copies its whole output (at batch 64 the Splits took ~11% of a prefill), while a
// node more or less costs the same as the Split it replaces in a one-sequence step.
// The additive biases instead of HF's 0/1 mask let the engine describe any layout (left padding, unused
// capacity, holes left by merged batches, causal prefill) with no mask logic in the graph.
import { maxSequence, ropeInvFreq, type ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { checkWeights, hasQkNorm, lmHead } from './tensors.ts';
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
/** Mode 'decode': every layer's new K and V in one output, [batch, layers * 2 * kv_heads, 1, head_dim]. */
export const NEW_KV_COLUMN = 'new_key_values';

/**
 * Rotary tables in HF-Llama layout (cos/sin of [freqs, freqs]), computed in float64 for accuracy; the sin table
 * has its first half negated so rotate_half(x) * sin becomes swap_halves(x) * sinSigned (no Neg node).
 */
export function ropeTables(c: ParsedModelConfig): { cos: Float32Array; sinSigned: Float32Array } {
  const D = c.head_dim;
  const half = D / 2;
  const positions = maxSequence(c);
  const invFreq = ropeInvFreq(c);
  const cos = new Float32Array(positions * D);
  const sinSigned = new Float32Array(positions * D);
  for (let p = 0; p < positions; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p * invFreq[i]!;
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

/** Columns [in, out] of a [out, in] HF Linear weight, written into `dst` (row stride `stride`) from column `col`. */
function putTransposed(dst: Float32Array, stride: number, col: number, w: Float32Array, outDim: number, inDim: number): void {
  for (let o = 0; o < outDim; o++) {
    const src = o * inDim;
    for (let i = 0; i < inDim; i++) dst[i * stride + col + o] = w[src + i]!;
  }
}

/** Build and encode the ONNX model. Throws WEIGHTS_FORMAT when a tensor is missing or mis-shaped. */
export function exportOnnx(c: ParsedModelConfig, weights: TensorMap, mode: OutputMode = 'last'): Uint8Array {
  checkWeights(c, weights);
  const g = new GraphBuilder();
  const E = c.hidden_size;
  const H = c.num_attention_heads;
  const KVH = c.num_key_value_heads;
  const D = c.head_dim;
  const G = H / KVH;
  const I = c.intermediate_size;
  const V = c.vocab_size;
  const qkNorm = hasQkNorm(c);
  const w = (name: string) => weights.get(name)!.data;
  const eps = g.scalar(c.rms_norm_eps);
  const rmsNorm = (x: string, weightName: string): string => {
    // Pow(x, 2) rather than x * x: onnxruntime fuses this exact pattern into one SimplifiedLayerNormalization.
    const ms = g.op('ReduceMean', [g.op('Pow', [x, g.scalar(2)])], { axes: [-1], keepdims: 1 });
    const normed = g.op('Div', [x, g.op('Sqrt', [g.op('Add', [ms, eps])])]);
    return g.op('Mul', [normed, g.weight(weightName, [E], w(weightName))]);
  };

  // One MatMul per layer computes q and k (in this order, `ropeHeads` heads of D), with the 1/sqrt(D) attention
  // scale folded into the q columns. rope(x) = x * cos + swap_halves(x) * sinSigned; swap_halves is one small
  // MatMul by a 0/1 permutation matrix (exact), so rotating q and k together takes no Slice/Concat.
  const ropeHeads = H + KVH;
  const scale = 1 / Math.sqrt(D);
  // Projections stacked column-wise into one [E, sum of outDims] weight (and bias, when the model has them).
  const stacked = (p: string, blocks: [string, number, number][]): { wt: Float32Array; bias: Float32Array | null } => {
    const cols = blocks.reduce((n, [, outDim]) => n + outDim, 0);
    const wt = new Float32Array(E * cols);
    const biases = blocks.map(([name]) => weights.get(p + name + '.bias')?.data);
    const bias = c.attention_bias && biases.every((b) => b) ? new Float32Array(cols) : null;
    let col = 0;
    blocks.forEach(([name, outDim, s], i) => {
      putTransposed(wt, cols, col, w(p + name + '.weight'), outDim, E);
      if (s !== 1) for (let r = 0; r < E; r++) for (let o = 0; o < outDim; o++) wt[r * cols + col + o]! *= s;
      if (bias) for (let o = 0; o < outDim; o++) bias[col + o] = biases[i]![o]! * s;
      col += outDim;
    });
    return { wt, bias };
  };
  const projection = (x: string, name: string, outDim: number, parts: { wt: Float32Array; bias: Float32Array | null }): string => {
    const y = g.op('MatMul', [x, g.weight(name + '.T', [E, outDim], parts.wt)]);
    return parts.bias ? g.op('Add', [y, g.weight(name + '.bias', [outDim], parts.bias)]) : y;
  };
  const swapMatrix = new Float32Array(D * D);
  for (let i = 0; i < D; i++) swapMatrix[i * D + ((i + D / 2) % D)] = 1; // row i → column i ± D/2
  const linear = (x: string, name: string, outDim: number, inDim: number): string => {
    const wt = new Float32Array(inDim * outDim);
    putTransposed(wt, outDim, 0, w(name), outDim, inDim);
    return g.op('MatMul', [x, g.weight(name + '.T', [inDim, outDim], wt)]);
  };

  const decode = mode === 'decode';
  const S: Dim = decode ? 1 : 'seq';
  const ids = g.input('input_ids', 'int64', ['batch', S]);
  const pos = g.input('position_ids', 'int64', ['batch', S]);
  const pastBias = g.input('past_bias', 'float', ['batch', 1, S, 'past']);
  const newBias = decode ? '' : g.input('new_bias', 'float', ['batch', 1, 'seq', 'seq']);

  // Rotary tables gathered by position: [batch, 1, D] per token in decode (broadcast over heads), else
  // [batch, 1, seq, D] (heads-first layout).
  const { cos, sinSigned } = ropeTables(c);
  const gatherRope = (name: string, table: Float32Array) => {
    const rows = g.op('Gather', [g.weight(name, [cos.length / D, D], table), pos], { axis: 0 }); // [batch, S, D]
    return decode ? rows : g.op('Unsqueeze', [rows, g.ints([1])]);
  };
  const cosB = gatherRope('rope.cos', cos);
  const sinB = gatherRope('rope.sin_signed', sinSigned);
  const lastAxis = g.ints([-1]);
  // Grouped-query attention without repeating K/V: the G query heads that share a KV head are stacked along
  // the sequence axis ([B, KVH, G*S, D]), so the additive biases are tiled G times along that axis once.
  const tileG = (b: string) => (G === 1 ? b : g.op('Concat', Array.from({ length: G }, () => b), { axis: 2 }));
  const pastBiasG = tileG(pastBias);
  const newBiasG = decode ? '' : tileG(newBias);
  const keysT = (k: string) => g.op('Transpose', [k], { perm: [0, 1, 3, 2] });
  let splitPastNew = '';
  const swapHalvesW = g.weight('rope.swap_halves', [D, D], swapMatrix);
  const qkSplit = g.ints([H, KVH]);

  // Decode: every layer's new K/V, concatenated into one output after the loop.
  const freshColumn: string[] = [];

  let x = g.op('Gather', [g.weight('model.embed_tokens.weight', [V, E], w('model.embed_tokens.weight')), ids], { axis: 0 });
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    g.input(pastKeyName(l), 'float', ['batch', KVH, 'past', D]);
    g.input(pastValueName(l), 'float', ['batch', KVH, 'past', D]);
    if (l === 0) {
      // Softmax runs over [past columns, new columns]; these sizes split the probabilities back.
      const pastLen = g.op('Shape', [pastKeyName(0)], { start: 2, end: 3 });
      splitPastNew = g.op('Concat', [pastLen, decode ? g.ints([1]) : g.op('Shape', [ids], { start: 1, end: 2 })], { axis: 0 });
    }
    const h = rmsNorm(x, p + 'input_layernorm.weight');
    // Qwen3's per-head q/k norms come between the projection and the rotation, so there the attention scale is
    // folded into q_norm's weights instead of q_proj's columns.
    const projQk = projection(h, p + 'qk', ropeHeads * D, stacked(p, [['self_attn.q_proj', H * D, qkNorm ? 1 : scale], ['self_attn.k_proj', KVH * D, 1]]));
    const projV = projection(h, p + 'v', KVH * D, stacked(p, [['self_attn.v_proj', KVH * D, 1]]));
    // Heads-first: [B, heads, D] in decode (S = 1), [B, heads, S, D] otherwise.
    const byHead = (x: string, n: number, out?: string) => (decode ? g.op('Reshape', [x, g.ints([0, n, D])], {}, out) : g.op('Transpose', [g.op('Reshape', [x, g.ints([0, 0, n, D])])], { perm: [0, 2, 1, 3] }, out));
    let qk = byHead(projQk, ropeHeads);
    if (qkNorm) {
      // one weight row per head: q_norm * scale for the q heads, k_norm for the k heads; [heads, D] broadcast over
      // the batch (decode) or [heads, 1, D] over the sequence too
      const wqk = new Float32Array(ropeHeads * D);
      for (let hh = 0; hh < ropeHeads; hh++)
        for (let e = 0; e < D; e++) wqk[hh * D + e] = hh < H ? w(p + 'self_attn.q_norm.weight')[e]! * scale : w(p + 'self_attn.k_norm.weight')[e]!;
      const ms = g.op('ReduceMean', [g.op('Pow', [qk, g.scalar(2)])], { axes: [-1], keepdims: 1 });
      const normed = g.op('Div', [qk, g.op('Sqrt', [g.op('Add', [ms, eps])])]);
      qk = g.op('Mul', [normed, g.weight(p + 'qk_norm', decode ? [ropeHeads, D] : [ropeHeads, 1, D], wqk)]);
    }
    const rotated = g.op('Add', [g.op('Mul', [qk, cosB]), g.op('Mul', [g.op('MatMul', [qk, swapHalvesW]), sinB])]);
    const [q, k] = g.ops('Split', [rotated, qkSplit], { axis: 1 }, [`q_${l}`, newKeyName(l)]) as [string, string];
    // Decode: K/V are [B, KVH, D] here (one token per row), reshaped for attention and concatenated for output.
    const k4 = decode ? g.op('Reshape', [k, g.ints([0, KVH, 1, D])]) : k;
    const v4 = decode ? g.op('Reshape', [projV, g.ints([0, KVH, 1, D])]) : byHead(projV, KVH, newValueName(l));
    if (decode) freshColumn.push(k4, v4);
    else {
      g.output(newKeyName(l), ['batch', KVH, S, D]);
      g.output(newValueName(l), ['batch', KVH, S, D]);
    }
    const qg = g.op('Reshape', [q, g.ints([0, KVH, -1, D])]);
    const scoresPast = g.op('Add', [g.op('MatMul', [qg, keysT(pastKeyName(l))]), pastBiasG]);
    // One new token (decode): its score and its share of the context are elementwise products, not B×KVH
    // tiny matrix products (whose per-call overhead dominated batch-64 steps).
    const scoresNew = decode ? g.op('ReduceSum', [g.op('Mul', [qg, k4]), lastAxis], { keepdims: 1 }) : g.op('Add', [g.op('MatMul', [qg, keysT(k4)]), newBiasG]);
    const probs = g.op('Softmax', [g.op('Concat', [scoresPast, scoresNew], { axis: -1 })], { axis: -1 });
    const [probsPast, probsNew] = g.ops('Split', [probs, splitPastNew], { axis: -1 }, [`probs_past_${l}`, `probs_new_${l}`]) as [string, string];
    const ctx = g.op('Add', [g.op('MatMul', [probsPast, pastValueName(l)]), decode ? g.op('Mul', [probsNew, v4]) : g.op('MatMul', [probsNew, v4])]);
    const merged = decode
      ? g.op('Reshape', [ctx, g.ints([0, 1, H * D])])
      : g.op('Reshape', [g.op('Transpose', [g.op('Reshape', [ctx, g.ints([0, H, -1, D])])], { perm: [0, 2, 1, 3] }), g.ints([0, 0, H * D])]);
    x = g.op('Add', [x, linear(merged, p + 'self_attn.o_proj.weight', E, H * D)]);
    const h2 = rmsNorm(x, p + 'post_attention_layernorm.weight');
    const gate = linear(h2, p + 'mlp.gate_proj.weight', I, E);
    const up = linear(h2, p + 'mlp.up_proj.weight', I, E);
    const act = g.op('Mul', [g.op('Mul', [gate, g.op('Sigmoid', [gate])]), up]);
    x = g.op('Add', [x, linear(act, p + 'mlp.down_proj.weight', E, I)]);
  }
  if (decode) {
    g.op('Concat', freshColumn, { axis: 1 }, NEW_KV_COLUMN);
    g.output(NEW_KV_COLUMN, ['batch', c.num_hidden_layers * 2 * KVH, 1, D]);
  }
  if (mode === 'last') x = g.op('Slice', [x, g.ints([-1]), g.ints([INT64_MAX]), g.ints([1])]);
  const normed = rmsNorm(x, 'model.norm.weight');
  const head = new Float32Array(E * V);
  putTransposed(head, V, 0, lmHead(c, weights), V, E);
  const logits = g.op('MatMul', [normed, g.weight('lm_head.T', [E, V], head)]);
  if (mode === 'all') {
    g.op('LogSoftmax', [logits], { axis: -1 }, 'logprobs');
    g.output('logprobs', ['batch', 'seq', V]);
  } else {
    // The next-token distribution at each row's temperature, softmax(logits / T): the engine samples from it
    // with subtractions only (no exp per vocabulary entry in JavaScript) and reports log(p[token]).
    const rows = g.op('Reshape', [logits, g.ints([-1, V])]);
    const invT = g.input('inv_temperature', 'float', ['batch', 1]);
    g.op('Softmax', [g.op('Mul', [rows, invT])], { axis: -1 }, 'probs');
    g.output('probs', ['batch', V]);
    // Mode 'last' also offers log_softmax(logits) (T = 1) for tests and tools that need exact tails.
    if (mode === 'last') {
      g.op('LogSoftmax', [rows], { axis: -1 }, 'logprobs');
      g.output('logprobs', ['batch', V]);
    }
  }
  return g.encode('rlstream_policy', OPSET);
}
