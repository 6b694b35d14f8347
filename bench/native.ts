// Native core throughput: tokens/s and model GFLOP/s of a full training step (forward + backward of the policy
// loss + clipping + AdamW) for ~0.2M, ~2M and ~20M parameter models, next to this machine's fp32 sgemm peak,
// plus peak memory. The peak and the three models run in interleaved rounds (bench/harness.ts: peak, 0.2M, 2M,
// 20M, peak, …) with a machine-speed probe before each; a model's share of the peak is taken against the peak of
// its own round (the VM's sgemm speed moves by 2× within an hour), and every figure is the median [min–max]
// over rounds.
//   npm run bench -- native [--rounds 3] [--threads N] [--quick]   (--quick: 2 steps a model, 1 round)
import { availableParallelism } from 'node:os';
import { nativeAvailable, sgemmGflops } from '../native/addon.ts';
import { Model, type ModelConfig } from '../native/model.ts';
import { int, parseFlags, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, stats, summarize, type Stats } from './harness.ts';

interface ModelRound {
  params: number;
  tokensPerStep: number;
  stepMs: number;
  forwardMs: number;
  tokensPerS: number;
  gflops: number;
  rssMiB: number;
  kernelShare: Record<string, number>;
}

type RoundResult = { peakGflops: number } | ModelRound;

const base = { rope_theta: 10000, rms_norm_eps: 1e-6, max_position_embeddings: 2048 };
const MODELS: [string, ModelConfig, number, number][] = [
  // name, config, sequences per batch, sequence length
  ['0.2M', { ...base, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 172, vocab_size: 1024, tie_word_embeddings: false }, 4, 256],
  ['2M', { ...base, hidden_size: 192, num_hidden_layers: 4, num_attention_heads: 6, num_key_value_heads: 2, intermediate_size: 512, vocab_size: 2048, tie_word_embeddings: true }, 4, 256],
  ['20M', { ...base, hidden_size: 512, num_hidden_layers: 6, num_attention_heads: 8, num_key_value_heads: 4, intermediate_size: 1408, vocab_size: 8192, tie_word_embeddings: true }, 4, 512],
];
const PEAK = 'sgemm peak';

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

/** A warm-up step, then `iters` timed steps and `iters` timed forward passes of one model. */
async function measure(name: string, cfg: ModelConfig, seqs: number, len: number, threads: number, iters: number): Promise<ModelRound> {
  const model = Model.init(cfg, { seed: 1, threads });
  try {
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
    let t0 = performance.now();
    for (let i = 0; i < iters; i++) await step();
    const stepMs = (performance.now() - t0) / iters;
    const prof = model.profile(true);
    t0 = performance.now();
    for (let i = 0; i < iters; i++) await model.forward(batch, targets);
    const forwardMs = (performance.now() - t0) / iters;
    const gflops = stepFlops(cfg, seqs, len) / (stepMs / 1000) / 1e9;
    if (!(gflops > 0)) throw new Error(`${name}: no step time measured`);
    return {
      params: model.numParameters,
      tokensPerStep: T,
      stepMs,
      forwardMs,
      tokensPerS: T / (stepMs / 1000),
      gflops,
      rssMiB: Math.round(process.memoryUsage().rss / 2 ** 20),
      kernelShare: Object.fromEntries(Object.entries(prof).map(([k, v]) => [k, Number((v / ((stepMs * iters) / 1000)).toFixed(3))])),
    };
  } finally {
    model.dispose();
  }
}

export async function main(args: string[]): Promise<unknown> {
  const { values: f } = parseFlags(args, { ...ROUND_FLAGS, threads: int(1) });
  if (!nativeAvailable()) {
    console.log('native addon not built: run `npm run build:native`');
    return { skipped: 'native addon not built' };
  }
  const quick = f.quick === true;
  const rounds = f.rounds ?? (quick ? 1 : 3);
  const threads = f.threads ?? availableParallelism();
  console.log(`native training step, ${threads} thread(s); ${rounds} interleaved rounds of ${[PEAK, ...MODELS.map(([n]) => n)].join(', ')}${quick ? ' (--quick: smoke size, figures mean nothing)' : ''}`);
  const records = await interleaved<RoundResult>(
    [
      { name: PEAK, run: async () => ({ peakGflops: sgemmGflops(2048, quick ? 2 : 4, threads) }) },
      ...MODELS.map(([name, cfg, seqs, len]) => ({ name, run: () => measure(name, cfg, seqs, len, threads, quick ? 2 : name === '20M' ? 4 : 8) })),
    ],
    rounds,
  );
  for (const r of records) if (r.error) console.log(`round ${r.round + 1} ${r.mode}: FAILED\n${r.error}`);
  if (records.some((r) => r.error)) process.exitCode = 1;
  const peakOf = (round: number) => {
    const p = records.find((r) => r.round === round && r.mode === PEAK)?.result;
    return p && 'peakGflops' in p ? p.peakGflops : NaN;
  };
  const peak = stats(records.filter((r) => r.mode === PEAK).map((r) => peakOf(r.round)));
  const modelRecords = records.filter((r) => r.mode !== PEAK && r.result) as (typeof records[number] & { result: ModelRound })[];
  const fig = (f: (x: ModelRound) => number) => summarize(modelRecords, f);
  const summary = {
    stepMs: fig((x) => x.stepMs),
    forwardMs: fig((x) => x.forwardMs),
    tokensPerS: fig((x) => x.tokensPerS),
    gflops: fig((x) => x.gflops),
    // Against the peak of the same round: both saw the machine at the same moment.
    pctOfPeak: Object.fromEntries(MODELS.map(([name]) => [name, stats(modelRecords.filter((r) => r.mode === name).map((r) => (100 * r.result.gflops) / peakOf(r.round)))])) as Record<string, Stats>,
  };
  const kernelShare = Object.fromEntries(MODELS.map(([name]) => [name, modelRecords.filter((r) => r.mode === name).at(-1)?.result.kernelShare ?? null]));
  const peakRssMiB = Math.round(process.resourceUsage().maxRSS / 1024);
  console.log(`\nsgemm 2048³ on ${threads} thread(s): ${fmtStats(peak, 1)} GFLOP/s; per model median [min–max] over ${rounds} round(s)`);
  console.log('model  params      tokens/step  step ms                fwd ms               tokens/s                 GFLOP/s              % of same-round peak');
  for (const [name] of MODELS) {
    const last = modelRecords.filter((r) => r.mode === name).at(-1)?.result;
    if (!last) continue;
    console.log([name.padEnd(6), String(last.params).padEnd(11), String(last.tokensPerStep).padEnd(12), fmtStats(summary.stepMs[name]!, 0).padEnd(22), fmtStats(summary.forwardMs[name]!, 0).padEnd(20), fmtStats(summary.tokensPerS[name]!, 0).padEnd(24), fmtStats(summary.gflops[name]!, 1).padEnd(20), fmtStats(summary.pctOfPeak[name]!, 1)].join(' '));
  }
  for (const [name, share] of Object.entries(kernelShare)) if (share) console.log(`${name}: share of step time by kernel kind: ${Object.entries(share).map(([k, v]) => `${k} ${(100 * v).toFixed(0)}%`).join(', ')}`);
  const speed = probeSummary(records);
  console.log(`\npeak RSS of the process: ${peakRssMiB} MiB; machine speed before each mode: sgemm 1024³ ${fmtStats(speed.sgemmGflops, 0)} GFLOP/s, JS loop ${fmtStats(speed.jsLoopMs, 0)} ms, load ${fmtStats(speed.load1m, 1)}`);
  return { options: { threads, rounds, quick }, summary: { sgemmPeakGflops: peak, ...summary }, kernelShare, peakRssMiB, machineSpeed: speed, rounds: records };
}
