// A plain-TypeScript, float64 forward of the Llama/Qwen2 decoder for one sequence: the independent reference
// the ONNX export is checked against (written from the model definition, not from the exporter).
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { lmHead, type PolicyModelConfig } from '../../producers/policy/config.ts';

function matvec(w: Float32Array, x: Float64Array, out: number, inDim: number, bias?: Float32Array): Float64Array {
  const y = new Float64Array(out);
  for (let o = 0; o < out; o++) {
    let s = bias ? bias[o]! : 0;
    const base = o * inDim;
    for (let i = 0; i < inDim; i++) s += w[base + i]! * x[i]!;
    y[o] = s;
  }
  return y;
}

function rmsNorm(x: Float64Array, w: Float32Array, eps: number): Float64Array {
  let ms = 0;
  for (const v of x) ms += v * v;
  const r = 1 / Math.sqrt(ms / x.length + eps);
  return x.map((v, i) => v * r * w[i]!);
}

function rope(vec: Float64Array, heads: number, D: number, pos: number, theta: number): void {
  const half = D / 2;
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      const a = pos / Math.pow(theta, (2 * i) / D);
      const x1 = vec[h * D + i]!;
      const x2 = vec[h * D + half + i]!;
      vec[h * D + i] = x1 * Math.cos(a) - x2 * Math.sin(a);
      vec[h * D + half + i] = x2 * Math.cos(a) + x1 * Math.sin(a);
    }
  }
}

/** Log-softmax of the logits at every position of `tokens` (positions 0..n-1): [n][vocab]. */
export function referenceLogprobs(c: PolicyModelConfig, wts: TensorMap, tokens: number[]): Float64Array[] {
  const W = (n: string) => wts.get(n)!.data;
  const Wopt = (n: string) => wts.get(n)?.data;
  const E = c.hiddenSize;
  const D = c.headDim;
  const H = c.numHeads;
  const KVH = c.numKvHeads;
  const G = H / KVH;
  const n = tokens.length;
  const emb = W('model.embed_tokens.weight');
  let xs: Float64Array[] = tokens.map((t) => Float64Array.from(emb.subarray(t * E, (t + 1) * E)));
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    const ks: Float64Array[] = [];
    const vs: Float64Array[] = [];
    const qs: Float64Array[] = [];
    for (let t = 0; t < n; t++) {
      const h = rmsNorm(xs[t]!, W(p + 'input_layernorm.weight'), c.rmsNormEps);
      const q = matvec(W(p + 'self_attn.q_proj.weight'), h, H * D, E, Wopt(p + 'self_attn.q_proj.bias'));
      const k = matvec(W(p + 'self_attn.k_proj.weight'), h, KVH * D, E, Wopt(p + 'self_attn.k_proj.bias'));
      const v = matvec(W(p + 'self_attn.v_proj.weight'), h, KVH * D, E, Wopt(p + 'self_attn.v_proj.bias'));
      rope(q, H, D, t, c.ropeTheta);
      rope(k, KVH, D, t, c.ropeTheta);
      qs.push(q);
      ks.push(k);
      vs.push(v);
    }
    const next: Float64Array[] = [];
    for (let t = 0; t < n; t++) {
      const ctx = new Float64Array(H * D);
      for (let h = 0; h < H; h++) {
        const kh = Math.floor(h / G);
        const scores = new Float64Array(t + 1);
        let max = -Infinity;
        for (let s = 0; s <= t; s++) {
          let dot = 0;
          for (let d = 0; d < D; d++) dot += qs[t]![h * D + d]! * ks[s]![kh * D + d]!;
          scores[s] = dot / Math.sqrt(D);
          max = Math.max(max, scores[s]!);
        }
        let sum = 0;
        for (let s = 0; s <= t; s++) sum += scores[s] = Math.exp(scores[s]! - max);
        for (let s = 0; s <= t; s++) for (let d = 0; d < D; d++) ctx[h * D + d] = ctx[h * D + d]! + (scores[s]! / sum) * vs[s]![kh * D + d]!;
      }
      const attn = matvec(W(p + 'self_attn.o_proj.weight'), ctx, E, H * D);
      const x1 = xs[t]!.map((v, i) => v + attn[i]!);
      const h2 = rmsNorm(x1, W(p + 'post_attention_layernorm.weight'), c.rmsNormEps);
      const gate = matvec(W(p + 'mlp.gate_proj.weight'), h2, c.intermediateSize, E);
      const up = matvec(W(p + 'mlp.up_proj.weight'), h2, c.intermediateSize, E);
      const act = gate.map((gv, i) => (gv / (1 + Math.exp(-gv))) * up[i]!);
      const down = matvec(W(p + 'mlp.down_proj.weight'), act, E, c.intermediateSize);
      next.push(x1.map((v, i) => v + down[i]!));
    }
    xs = next;
  }
  const head = lmHead(c, wts);
  return xs.map((x) => {
    const logits = matvec(head, rmsNorm(x, W('model.norm.weight'), c.rmsNormEps), c.vocabSize, E);
    let max = -Infinity;
    for (const v of logits) max = Math.max(max, v);
    let sum = 0;
    for (const v of logits) sum += Math.exp(v - max);
    const lz = max + Math.log(sum);
    return logits.map((v) => v - lz);
  });
}
