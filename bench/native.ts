// Native core throughput: tokens/s and model GFLOP/s of a full training step (forward + backward of the policy
// loss + clipping + AdamW) for ~0.2M, ~2M and ~20M parameter models, next to this machine's fp32 sgemm peak
// measured in the same run, plus peak memory. Run: npm run bench -- native [--quick] [--threads N]
import { availableParallelism } from 'node:os';
import { nativeAvailable, sgemmGflops } from '../native/addon.ts';
import { Model, type ModelConfig } from '../native/model.ts';

interface Row {
  model: string;
  params: number;
  tokensPerStep: number;
  stepMs: number;
  forwardMs: number;
  tokensPerS: number;
  gflops: number;
  pctOfPeak: number;
  rssMiB: number;
  kernelShare: Record<string, number>;
}

const base = { rope_theta: 10000, rms_norm_eps: 1e-6, max_position_embeddings: 2048 };
const MODELS: [string, ModelConfig, number, number][] = [
  // name, config, sequences per batch, sequence length
  ['0.2M', { ...base, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 172, vocab_size: 1024, tie_word_embeddings: false }, 4, 256],
  ['2M', { ...base, hidden_size: 192, num_hidden_layers: 4, num_attention_heads: 6, num_key_value_heads: 2, intermediate_size: 512, vocab_size: 2048, tie_word_embeddings: true }, 4, 256],
  ['20M', { ...base, hidden_size: 512, num_hidden_layers: 6, num_attention_heads: 8, num_key_value_heads: 4, intermediate_size: 1408, vocab_size: 8192, tie_word_embeddings: true }, 4, 512],
];

/** Model FLOPs of one training step: 6 per matmul weight per token + causal attention (forward x3). */
function stepFlops(c: ModelConfig, seqs: number, len: number): number {
  const H = c.hidden_size;
  const hd = H / c.num_attention_heads;
  const kv = c.num_key_value_heads * hd;
  const perLayer = H * H * 2 + H * kv * 2 + 3 * H * c.intermediate_size;
  const matmulParams = perLayer * c.num_hidden_layers + c.vocab_size * H;
  const T = seqs * len;
  const pairs = (seqs * len * (len + 1)) / 2;
  const attention = 3 * 4 * H * pairs * c.num_hidden_layers;
  return 6 * matmulParams * T + attention;
}

export async function main(args: string[]): Promise<unknown> {
  if (!nativeAvailable()) {
    console.log('native addon not built: run `npm run build:native`');
    return { skipped: 'native addon not built' };
  }
  const quick = args.includes('--quick');
  const ti = args.indexOf('--threads');
  const threads = ti >= 0 ? Number(args[ti + 1]) : availableParallelism();
  const peak = sgemmGflops(2048, quick ? 2 : 4, threads);
  console.log(`sgemm 2048^3 with ${threads} thread(s): ${peak.toFixed(1)} GFLOP/s (measured now; the machine is shared, so noisy)`);
  const rows: Row[] = [];
  for (const [name, cfg, seqs, len] of MODELS) {
    const model = Model.init(cfg, { seed: 1, threads });
    const T = seqs * len;
    const tokens = new Int32Array(T);
    const targets = new Int32Array(T);
    const mask = new Float32Array(T).fill(1);
    const adv = new Float32Array(T);
    const behav = new Float32Array(T);
    for (let t = 0; t < T; t++) {
      tokens[t] = (t * 7919) % cfg.vocab_size;
      targets[t] = (t * 104729 + 3) % cfg.vocab_size;
      adv[t] = ((t % 13) - 6) / 6;
      behav[t] = -Math.log(cfg.vocab_size) + ((t % 5) - 2) * 0.05;
    }
    const seqStarts = Int32Array.from({ length: seqs + 1 }, (_, i) => i * len);
    const batch = { tokens, seqStarts };
    const step = async (): Promise<void> => {
      model.zeroGrad();
      await model.backwardPolicyLoss(batch, { targets, responseMask: mask, advantages: adv, behaviourLogprobs: behav }, { clipLow: 0.2, clipHigh: 0.28 });
      model.clipGradNorm(1.0);
      await model.adamwStep({ lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01 });
    };
    await step(); // warm-up: allocates activations
    model.profile(true);
    const iters = quick ? 2 : name === '20M' ? 4 : 8;
    let t0 = performance.now();
    for (let i = 0; i < iters; i++) await step();
    const stepMs = (performance.now() - t0) / iters;
    const prof = model.profile(true);
    const split = Object.entries(prof)
      .map(([k, v]) => `${k} ${((100 * v) / ((stepMs * iters) / 1000)).toFixed(0)}%`)
      .join(', ');
    console.log(`${name}: share of step time by kernel kind: ${split}`);
    t0 = performance.now();
    for (let i = 0; i < iters; i++) await model.forward(batch, targets);
    const forwardMs = (performance.now() - t0) / iters;
    const gflops = stepFlops(cfg, seqs, len) / (stepMs / 1000) / 1e9;
    const row: Row = {
      model: name,
      params: model.numParameters,
      tokensPerStep: T,
      stepMs: Math.round(stepMs),
      forwardMs: Math.round(forwardMs),
      tokensPerS: Math.round(T / (stepMs / 1000)),
      gflops: Number(gflops.toFixed(1)),
      pctOfPeak: Number(((100 * gflops) / peak).toFixed(1)),
      rssMiB: Math.round(process.memoryUsage().rss / 2 ** 20),
      kernelShare: Object.fromEntries(Object.entries(prof).map(([k, v]) => [k, Number((v / ((stepMs * iters) / 1000)).toFixed(3))])),
    };
    rows.push(row);
    model.dispose();
  }
  // The machine is shared: take the peak again after the models and compare against the better of the two.
  const peakAfter = sgemmGflops(2048, quick ? 2 : 4, threads);
  const peakMax = Math.max(peak, peakAfter);
  for (const r of rows) r.pctOfPeak = Number(((100 * r.gflops) / peakMax).toFixed(1));
  const peakRssMiB = Math.round(process.resourceUsage().maxRSS / 1024);
  console.log('');
  console.log('model  params      tokens/step  step ms  fwd ms  tokens/s  GFLOP/s  % of sgemm peak  RSS MiB');
  for (const r of rows)
    console.log(
      `${r.model.padEnd(6)} ${String(r.params).padEnd(11)} ${String(r.tokensPerStep).padEnd(12)} ${String(r.stepMs).padEnd(8)} ${String(r.forwardMs).padEnd(7)} ${String(r.tokensPerS).padEnd(9)} ${String(r.gflops).padEnd(8)} ${String(r.pctOfPeak).padEnd(16)} ${r.rssMiB}`,
    );
  console.log(`\npeak RSS of the process: ${peakRssMiB} MiB; threads: ${threads}; sgemm peak before/after: ${peak.toFixed(1)} / ${peakAfter.toFixed(1)} GFLOP/s (% uses the larger)`);
  return { threads, sgemmPeakGflopsBefore: Number(peak.toFixed(1)), sgemmPeakGflopsAfter: Number(peakAfter.toFixed(1)), peakRssMiB, rows };
}
