// Independent plain-TypeScript reference of the model and losses on Float64Array: the check for the native core
// (tests compare log-probs, losses and finite-difference gradients) and a readable forward for anyone who needs
// one. Written from the math, not from the C++; slow by design (tiny configs only).
import type { ModelConfig, PackedBatch, PolicyLossInputs, PolicyLossOptions } from './model.ts';

export type RefParams = Map<string, Float64Array>;

/** Copies native parameter views (float32) into float64 reference parameters. */
export function toReferenceParams(views: Map<string, { data: Float32Array }>): RefParams {
  const p: RefParams = new Map();
  for (const [n, v] of views) p.set(n, Float64Array.from(v.data));
  return p;
}

function get(p: RefParams, name: string): Float64Array {
  const t = p.get(name);
  if (!t) throw new Error(`reference: missing parameter ${name}`);
  return t;
}

// y[n, o] = sum_c x[n, c] W[o, c] + b[o]
function linear(x: Float64Array, N: number, C: number, W: Float64Array, O: number, b?: Float64Array): Float64Array {
  const y = new Float64Array(N * O);
  for (let n = 0; n < N; n++)
    for (let o = 0; o < O; o++) {
      let s = b ? b[o]! : 0;
      for (let c = 0; c < C; c++) s += x[n * C + c]! * W[o * C + c]!;
      y[n * O + o] = s;
    }
  return y;
}

function rmsnorm(x: Float64Array, N: number, C: number, w: Float64Array, eps: number): Float64Array {
  const y = new Float64Array(N * C);
  for (let n = 0; n < N; n++) {
    let ss = 0;
    for (let c = 0; c < C; c++) ss += x[n * C + c]! ** 2;
    const r = 1 / Math.sqrt(ss / C + eps);
    for (let c = 0; c < C; c++) y[n * C + c] = w[c]! * x[n * C + c]! * r;
  }
  return y;
}

// Rotary inverse frequencies theta^(-2i/d), rounded like float32 HF; with Llama 3.1's scaling (rope_scaling
// rope_type llama3) the long wavelengths are divided by `factor`, the short kept and the band between interpolated
// linearly in 1/wavelength (Meta's apply_scaling).
function invFreq(cfg: ModelConfig, d: number): number[] {
  const out: number[] = [];
  const r = cfg.rope_scaling ?? null;
  for (let i = 0; i < d / 2; i++) {
    const f = Math.fround(1 / Math.fround(Math.pow(cfg.rope_theta, (2 * i) / d)));
    if (!r) {
      out.push(f);
      continue;
    }
    const wavelen = (2 * Math.PI) / f;
    const low = r.original_max_position_embeddings / r.low_freq_factor;
    const high = r.original_max_position_embeddings / r.high_freq_factor;
    if (wavelen < high) out.push(f);
    else if (wavelen > low) out.push(Math.fround(f / r.factor));
    else {
      const smooth = (r.original_max_position_embeddings / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      out.push(Math.fround((1 - smooth) * (f / r.factor) + smooth * f));
    }
  }
  return out;
}

// HF rotary (rotate_half): x' = x cos + rotate_half(x) sin, angle = pos * inv_freq rounded like float32 HF.
function rope(x: Float64Array, T: number, heads: number, d: number, pos: Int32Array, inv: number[]): void {
  const half = d / 2;
  for (let t = 0; t < T; t++)
    for (let i = 0; i < half; i++) {
      const ang = Math.fround(pos[t]! * inv[i]!);
      const c = Math.cos(ang);
      const s = Math.sin(ang);
      for (let h = 0; h < heads; h++) {
        const base = (t * heads + h) * d;
        const a = x[base + i]!;
        const b = x[base + i + half]!;
        x[base + i] = a * c - b * s;
        x[base + i + half] = b * c + a * s;
      }
    }
}

/**
 * LoRA adapters in the reference: a projection whose `<module>.lora_A.weight` and `lora_B.weight` are in the
 * parameters adds scale * (x' A^T) B^T, x' = x times `dropMask(layer, target, T * in)` where one is given (the
 * multiplier of each input element: 0 or 1/(1 - p)), else x.
 */
export interface RefLora {
  scale: number;
  dropMask?: (layer: number, target: string, n: number) => Float64Array;
}

/** Logits [T, V] of the model for a packed batch. */
export function referenceLogits(cfg: ModelConfig, p: RefParams, batch: PackedBatch, lora?: RefLora): Float64Array {
  const T = batch.tokens.length;
  const H = cfg.hidden_size;
  const NH = cfg.num_attention_heads;
  const NKV = cfg.num_key_value_heads;
  const d = cfg.head_dim ?? H / NH;
  const inv = invFreq(cfg, d);
  const I = cfg.intermediate_size;
  const V = cfg.vocab_size;
  const eps = cfg.rms_norm_eps;
  const pos = new Int32Array(T);
  const seqOf = new Int32Array(T);
  for (let s = 0; s + 1 < batch.seqStarts.length; s++)
    for (let t = batch.seqStarts[s]!; t < batch.seqStarts[s + 1]!; t++) {
      pos[t] = t - batch.seqStarts[s]!;
      seqOf[t] = batch.seqStarts[s]!;
    }
  const emb = get(p, 'model.embed_tokens.weight');
  let x = new Float64Array(T * H);
  for (let t = 0; t < T; t++) for (let c = 0; c < H; c++) x[t * H + c] = emb[batch.tokens[t]! * H + c]!;

  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    const pre = `model.layers.${l}.`;
    const bias = (n: string): Float64Array | undefined => (cfg.attention_bias ? get(p, pre + n) : undefined);
    // the projection `mod` (e.g. self_attn.q_proj) of x [T, C] to [T, O], with its adapter where there is one
    const proj = (mod: string, xin: Float64Array, C: number, O: number, b?: Float64Array): Float64Array => {
      const y = linear(xin, T, C, get(p, `${pre}${mod}.weight`), O, b);
      const A = p.get(`${pre}${mod}.lora_A.weight`);
      if (!A || !lora) return y;
      const r = A.length / C;
      const m = lora.dropMask?.(l, mod.split('.')[1]!, T * C);
      const u = linear(m ? xin.map((val, i) => val * m[i]!) : xin, T, C, A, r);
      const z = linear(u, T, r, get(p, `${pre}${mod}.lora_B.weight`), O);
      for (let i = 0; i < y.length; i++) y[i]! += lora.scale * z[i]!;
      return y;
    };
    const h = rmsnorm(x, T, H, get(p, pre + 'input_layernorm.weight'), eps);
    const q = proj('self_attn.q_proj', h, H, NH * d, bias('self_attn.q_proj.bias'));
    const k = proj('self_attn.k_proj', h, H, NKV * d, bias('self_attn.k_proj.bias'));
    const v = proj('self_attn.v_proj', h, H, NKV * d, bias('self_attn.v_proj.bias'));
    if (cfg.model_type === 'qwen3') {
      // Qwen3: each head of q and k RMS-normalised (weights [d]) before the rotation
      q.set(rmsnorm(q, T * NH, d, get(p, pre + 'self_attn.q_norm.weight'), eps));
      k.set(rmsnorm(k, T * NKV, d, get(p, pre + 'self_attn.k_norm.weight'), eps));
    }
    rope(q, T, NH, d, pos, inv);
    rope(k, T, NKV, d, pos, inv);
    const att = new Float64Array(T * NH * d);
    for (let hh = 0; hh < NH; hh++) {
      const kh = Math.floor(hh / (NH / NKV));
      for (let t = 0; t < T; t++) {
        const scores: number[] = [];
        for (let j = seqOf[t]!; j <= t; j++) {
          let s = 0;
          for (let e = 0; e < d; e++) s += q[(t * NH + hh) * d + e]! * k[(j * NKV + kh) * d + e]!;
          scores.push(s / Math.sqrt(d));
        }
        const mx = Math.max(...scores);
        const ex = scores.map((s) => Math.exp(s - mx));
        const z = ex.reduce((a, b) => a + b, 0);
        for (let j = seqOf[t]!, n = 0; j <= t; j++, n++)
          for (let e = 0; e < d; e++) att[(t * NH + hh) * d + e]! += (ex[n]! / z) * v[(j * NKV + kh) * d + e]!;
      }
    }
    const o = proj('self_attn.o_proj', att, NH * d, H);
    const mid = x.map((val, i) => val + o[i]!);
    const h2 = rmsnorm(mid, T, H, get(p, pre + 'post_attention_layernorm.weight'), eps);
    const g = proj('mlp.gate_proj', h2, H, I);
    const u = proj('mlp.up_proj', h2, H, I);
    const a = g.map((gv, i) => (gv / (1 + Math.exp(-gv))) * u[i]!);
    const down = proj('mlp.down_proj', a, I, H);
    x = mid.map((val, i) => val + down[i]!);
  }
  const xf = rmsnorm(x, T, H, get(p, 'model.norm.weight'), eps);
  const head = cfg.tie_word_embeddings ? emb : get(p, 'lm_head.weight');
  return linear(xf, T, H, head, V);
}

/** Per-token log-prob of targets (0 where target < 0) and entropy. */
export function referenceForward(cfg: ModelConfig, p: RefParams, batch: PackedBatch, targets: Int32Array, lora?: RefLora): { logprobs: Float64Array; entropy: Float64Array } {
  const T = batch.tokens.length;
  const V = cfg.vocab_size;
  const logits = referenceLogits(cfg, p, batch, lora);
  const logprobs = new Float64Array(T);
  const entropy = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    const row = logits.subarray(t * V, (t + 1) * V);
    const mx = Math.max(...row);
    let z = 0;
    for (const v of row) z += Math.exp(v - mx);
    const lse = mx + Math.log(z);
    let h = 0;
    for (const v of row) h -= Math.exp(v - lse) * (v - lse);
    entropy[t] = h;
    logprobs[t] = targets[t]! >= 0 ? row[targets[t]!]! - lse : 0;
  }
  return { logprobs, entropy };
}

/** verl agg_loss over packed sequences; sequences without masked tokens are left out of the seq-mean modes. */
export function aggregate(values: ArrayLike<number>, responseMask: ArrayLike<number>, seqStarts: Int32Array, mode: NonNullable<PolicyLossOptions['aggregation']>): number {
  if (mode === 'token-mean') {
    let s = 0;
    let m = 0;
    for (let t = 0; t < values.length; t++) {
      s += values[t]! * responseMask[t]!;
      m += responseMask[t]!;
    }
    return m === 0 ? 0 : s / m;
  }
  const per: number[] = [];
  for (let i = 0; i + 1 < seqStarts.length; i++) {
    let s = 0;
    let m = 0;
    for (let t = seqStarts[i]!; t < seqStarts[i + 1]!; t++) {
      s += values[t]! * responseMask[t]!;
      m += responseMask[t]!;
    }
    if (m === 0) continue;
    per.push(mode === 'seq-mean-token-sum' ? s : s / m);
  }
  return per.length === 0 ? 0 : per.reduce((a, b) => a + b, 0) / per.length;
}

const clamp = (x: number, lo: number, hi: number): number => Math.min(hi, Math.max(lo, x));

/** The rollout-correction weight of each token: pi_prox / pi_behaviour of the token or of its sequence, truncated or masked. */
function correctionWeights(inputs: PolicyLossInputs, seqStarts: Int32Array, o: PolicyLossOptions): Float64Array {
  const T = inputs.responseMask.length;
  const c = o.correction ?? (o.iwCap === null ? { mode: 'off' as const } : { mode: 'truncate' as const, cap: o.iwCap ?? 2 });
  const w = new Float64Array(T).fill(1);
  if (c.mode === 'off') return w;
  const logw = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    const behav = inputs.behaviourLogprobs[t]!;
    logw[t] = (inputs.proximalLogprobs ? inputs.proximalLogprobs[t]! : behav) - behav;
  }
  if ((c.level ?? 'token') === 'sequence')
    for (let i = 0; i + 1 < seqStarts.length; i++) {
      let sum = 0;
      for (let t = seqStarts[i]!; t < seqStarts[i + 1]!; t++) sum += inputs.responseMask[t]! * logw[t]!;
      for (let t = seqStarts[i]!; t < seqStarts[i + 1]!; t++) logw[t] = sum;
    }
  for (let t = 0; t < T; t++) {
    const raw = Math.exp(clamp(logw[t]!, -20, 20));
    w[t] = c.mode === 'truncate' ? Math.min(raw, c.cap) : raw >= c.low && raw <= c.high ? raw : 0;
  }
  return w;
}

/**
 * Scalar RL policy loss from per-token log-probs and entropies (verl compute_policy_loss + kl_penalty semantics).
 * `detached` are the log-probs at which stop-gradient factors are evaluated (CISPO's clipped weight): the current
 * log-probs in a single evaluation; fixed at the base point when finite differences probe the surrogate's gradient.
 */
export function referencePolicyLossFromLogprobs(
  logp: ArrayLike<number>,
  entropy: ArrayLike<number>,
  inputs: PolicyLossInputs,
  seqStarts: Int32Array,
  o: PolicyLossOptions,
  detached: ArrayLike<number> = logp,
): { loss: number; pgLoss: number; kl: number; entropy: number } {
  const T = logp.length;
  const pg = new Float64Array(T);
  const kl = new Float64Array(T);
  const iw = correctionWeights(inputs, seqStarts, o);
  const loss = o.loss ?? 'ppo';
  const prox = (t: number): number => (inputs.proximalLogprobs ? inputs.proximalLogprobs[t]! : inputs.behaviourLogprobs[t]!);
  // GSPO: every token sees its sequence's log-ratio, the masked mean of the token log-ratios.
  const x = new Float64Array(T);
  for (let t = 0; t < T; t++) x[t] = logp[t]! - prox(t);
  if (loss === 'gspo')
    for (let i = 0; i + 1 < seqStarts.length; i++) {
      let s = 0;
      let m = 0;
      for (let t = seqStarts[i]!; t < seqStarts[i + 1]!; t++) {
        s += inputs.responseMask[t]! * (logp[t]! - prox(t));
        m += inputs.responseMask[t]!;
      }
      for (let t = seqStarts[i]!; t < seqStarts[i + 1]!; t++) x[t] = m === 0 ? 0 : s / m;
    }
  for (let t = 0; t < T; t++) {
    if (inputs.responseMask[t] === 0) continue;
    const A = inputs.advantages[t]!;
    let l: number;
    if (loss === 'cispo') {
      const r = Math.exp(clamp(detached[t]! - prox(t), -20, 20));
      l = -clamp(r, 1 - o.clipLow, 1 + o.clipHigh) * A * x[t]!;
    } else {
      const ratio = Math.exp(clamp(x[t]!, -20, 20));
      l = Math.max(-A * ratio, -A * clamp(ratio, 1 - o.clipLow, 1 + o.clipHigh));
      if (loss === 'ppo' && o.dualClipC != null && A < 0) l = Math.min(l, -A * o.dualClipC);
    }
    pg[t] = iw[t]! * l;
    if (inputs.refLogprobs) {
      const y = clamp(logp[t]! - inputs.refLogprobs[t]!, -20, 20);
      const type = o.klType ?? 'k3';
      kl[t] = type === 'k1' ? y : type === 'k2' ? (y * y) / 2 : clamp(Math.exp(-y) + y - 1, -10, 10);
    }
  }
  const mode = o.aggregation ?? 'token-mean';
  const pgLoss = aggregate(pg, inputs.responseMask, seqStarts, mode);
  const klv = aggregate(kl, inputs.responseMask, seqStarts, mode);
  const ent = aggregate(entropy, inputs.responseMask, seqStarts, mode);
  const total = (o.lossScale ?? 1) * (pgLoss + (o.klCoef ?? 0) * klv - (o.entropyCoef ?? 0) * ent);
  return { loss: total, pgLoss, kl: klv, entropy: ent };
}

export function referencePolicyLoss(cfg: ModelConfig, p: RefParams, batch: PackedBatch, inputs: PolicyLossInputs, o: PolicyLossOptions, detached?: ArrayLike<number>): number {
  const { logprobs, entropy } = referenceForward(cfg, p, batch, inputs.targets);
  return referencePolicyLossFromLogprobs(logprobs, entropy, inputs, batch.seqStarts, o, detached ?? logprobs).loss;
}

export function referenceCrossEntropy(cfg: ModelConfig, p: RefParams, batch: PackedBatch, targets: Int32Array, responseMask: Float32Array, lossScale = 1, lora?: RefLora): number {
  const { logprobs } = referenceForward(cfg, p, batch, targets, lora);
  let s = 0;
  let m = 0;
  for (let t = 0; t < logprobs.length; t++) {
    s -= logprobs[t]! * responseMask[t]!;
    m += responseMask[t]!;
  }
  return m === 0 ? 0 : (lossScale * s) / m;
}
