// Decode throughput of the native core's generation on one device, the SmolLM2-135M shape, `--shape 500m` or
// `--shape 7b` (Qwen2.5-7B's sizes; random weights, generation-only: speed does not depend on their values): for each batch B, B slots are prefilled with `--context` random tokens, then
// `--steps` decode steps are timed three ways: Model.extend alone (the model's step: forward over the KV cache,
// softmax rows, the [B, V] rows copied to the host), a decode loop on Model.extendSample (the call the engine
// makes: tokens drawn on the device, only they and their log-probs come back, each step's tokens fed to the next)
// and NativeEngine end to end (extendSample plus the engine's own work, temperature 1), the last as the difference
// between a run of steps+1 new tokens and a run of 1 so that it counts decode only (its prefill steps carry the
// decoding rows of requests admitted before them, so it also counts those rows' share of mixed, ungraphed steps).
// One JSON line per batch on stdout. test/gpu/generate_hf.py measures transformers the same way.
// `--engine off` times Model.extend alone (with RLSTREAM_CUDA_SYNC=1 its per-kernel profile is GPU time).
// `--engine-batches 1,64` limits the engine runs (each prefills the batch three times: minutes at 7B and batch 256).
// On cuda it also prints how many slots of context + steps + 1 tokens the built-in policy's sizing
// (producers/policy/kv-sizing.ts) gives this model at `--gpu-memory-utilization` (default 0.9; the rest is the
// trainer's share), from the card's free memory before and after the model loaded.
//   node --import tsx test/gpu/generate-bench.ts [--device cuda] [--shape 135m|500m|7b] [--batches 1,64,256] [--context 512] [--steps 64] [--engine off] [--engine-batches 1,64]
import { Model, type ModelConfig } from '../../native/index.ts';
import { cudaMemory } from '../../native/addon.ts';
import { kvCacheSlots } from '../../producers/policy/kv-sizing.ts';
import { DEFAULT_PREFILL_TOKENS, NativeEngine } from '../../producers/policy/native-engine.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { SHAPE_500M, SHAPE_7B, SMOLLM2_135M } from '../../bench/shapes.ts';

const SHAPES: Record<string, ModelConfig> = { '135m': SMOLLM2_135M, '500m': SHAPE_500M, '7b': SHAPE_7B };

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : dflt;
}

const device = arg('device', 'cuda') as 'cpu' | 'cuda';
const batches = arg('batches', '1,64,256').split(',').map(Number);
const context = Number(arg('context', '512'));
const steps = Number(arg('steps', '64'));
const shapeName = arg('shape', '135m');
const shape = SHAPES[shapeName];
if (!shape) throw new Error(`--shape must be one of ${Object.keys(SHAPES).join(', ')}, got ${shapeName}`);
const engineBatches = new Set(arg('engine-batches', batches.join(',')).split(',').map(Number));
const utilization = Number(arg('gpu-memory-utilization', '0.9'));
const V = shape.vocab_size;
let seed = 12345;
const rand = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
const randomTokens = (n: number) => Int32Array.from({ length: n }, () => Math.floor(rand() * V));

const memBefore = device === 'cuda' ? cudaMemory() : null;
const tInit = performance.now();
// generation-only (no gradients or AdamW moments): a 7B model's fp32 parameters and their bf16 copies fit beside a
// cache of 256 rows of 2k tokens
const model = Model.init(shape, { seed: 1, initStd: 0.02, device, trainable: false });
const initS = (performance.now() - tInit) / 1000;
// first use: activations and (on cuda) the bf16 weight copies are made here, not inside a timed phase
model.kvReserve(1, context + 1);
await model.extend(Int32Array.of(0), Int32Array.of(context), randomTokens(context));
const memAfter = device === 'cuda' ? cudaMemory() : null;
if (memBefore && memAfter) {
  const maxLen = context + steps + 1;
  const maxBatch = Math.max(...batches);
  const sizing = kvCacheSlots({
    totalBytes: memAfter.total,
    freeBeforeBytes: memBefore.free,
    freeAfterBytes: memAfter.free,
    utilization,
    trainerCopy: false,
    stepBytes: model.activationBytes(DEFAULT_PREFILL_TOKENS + maxBatch),
    slotBytes: model.kvBytes(1, maxLen),
    maxBatch: 4096,
    maxLen,
  });
  console.log(
    JSON.stringify({
      shape: shapeName,
      parameters: model.numParameters,
      initS: +initS.toFixed(1),
      gpuTotalGiB: +(memAfter.total / 1024 ** 3).toFixed(1),
      loadedGiB: +(sizing.weightsBytes / 1024 ** 3).toFixed(2),
      gpuMemoryUtilization: utilization,
      kvSlotsOfMaxLen: sizing.slots,
      maxLen,
      slotMiB: +(model.kvBytes(1, maxLen) / 1024 ** 2).toFixed(1),
    }),
  );
  if (sizing.slots < maxBatch) throw new Error(`gpu_memory_utilization ${utilization} gives ${sizing.slots} slots of ${maxLen} tokens, fewer than batch ${maxBatch}`);
}
for (const B of batches) {
  // Model.extend alone
  model.kvReserve(B, context + steps + 1);
  const group = Math.max(1, Math.floor(4096 / context));
  const t0 = performance.now();
  for (let b0 = 0; b0 < B; b0 += group) {
    const n = Math.min(group, B - b0);
    await model.extend(Int32Array.from({ length: n }, (_, i) => b0 + i), new Int32Array(n).fill(context), randomTokens(n * context));
  }
  const prefillS = (performance.now() - t0) / 1000;
  const slots = Int32Array.from({ length: B }, (_, i) => i);
  const ones = new Int32Array(B).fill(1);
  const rows = new Float32Array(B * V);
  const inv = new Float32Array(B).fill(1);
  // every slot back to its prompt, between the warm-ups and the timed steps
  const rewind = () => {
    for (let b = 0; b < B; b++) model.kvTruncate(b, context);
  };
  for (let i = 0; i < 2; i++) await model.extend(slots, ones, randomTokens(B), inv, rows); // warm-up
  rewind();
  model.profile(true);
  const t1 = performance.now();
  for (let i = 0; i < steps; i++) await model.extend(slots, ones, randomTokens(B), inv, rows);
  const stepS = (performance.now() - t1) / 1000 / steps;
  // Kernel wall time per kind in a step (GPU time when RLSTREAM_CUDA_SYNC=1 makes each kernel wait; `logits`
  // includes the rows' copy to the host); the rest of the step is host work (N-API, JS, launches).
  const prof = Object.fromEntries(Object.entries(model.profile(true)).map(([k, v]) => [k, +((v / steps) * 1000).toFixed(3)]));
  // Model.extendSample as a decode loop: each step's sampled tokens are the next step's input
  const u = new Float64Array(B);
  const drawn = async (fed: Int32Array): Promise<Int32Array> => {
    for (let b = 0; b < B; b++) u[b] = rand();
    return (await model.extendSample(slots, ones, fed, inv, u)).tokens;
  };
  rewind();
  let fed: Int32Array = randomTokens(B);
  for (let i = 0; i < 2; i++) fed = await drawn(fed); // warm-up
  rewind();
  const t2 = performance.now();
  for (let i = 0; i < steps; i++) fed = await drawn(fed);
  const sampleS = (performance.now() - t2) / 1000 / steps;
  // NativeEngine: prefill + n tokens, sampled at temperature 1
  const engineRun = async (n: number): Promise<number> => {
    const engine = new NativeEngine(model, { slots: B, maxLen: context + steps + 1 });
    const sampling = { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: n, seed: 1, stop_token_ids: [] } as unknown as SamplingParams;
    const t = performance.now();
    await Promise.all(Array.from({ length: B }, (_, i) => engine.generate({ requestId: `b${i}`, promptIds: Array.from(randomTokens(context)), sampling })));
    engine.close();
    return (performance.now() - t) / 1000;
  };
  const withEngine = arg('engine', 'on') !== 'off' && engineBatches.has(B);
  // The warm-up runs past the prefills (DEFAULT_PREFILL_TOKENS a step) into steps of B rows, so that the timed
  // runs replay the graph of B rows rather than capture it. The timed run's tail still passes smaller batch sizes
  // a second time (rows admitted in later prefill steps finish later), and their graphs are captured in it.
  if (withEngine) await engineRun(Math.min(steps + 1, Math.ceil((B * context) / DEFAULT_PREFILL_TOKENS) + 4));
  const e1 = withEngine ? await engineRun(1) : NaN;
  const eN = withEngine ? await engineRun(steps + 1) : NaN;
  // Bytes a decode step must read at least: the bf16 weight copies the products use (a tied embedding once, as
  // the head; an untied one not at all: a step reads B of its rows) and every row's K and V so far (in the cache's
  // own precision: bf16 on cuda, fp32 on the cpu): over HBM bandwidth, the step's lower bound.
  const embedding = shape.tie_word_embeddings ? 0 : shape.vocab_size * shape.hidden_size;
  const stepBytes = (model.numParameters - embedding) * 2 + B * model.kvBytes(1, context);
  console.log(
    JSON.stringify({
      impl: `rlstream native (${device})`,
      shape: shapeName,
      stepBytes,
      batch: B,
      context,
      steps,
      prefillTokensPerS: Math.round((B * context) / prefillS),
      extendStepMs: +(stepS * 1000).toFixed(3),
      extendTokensPerS: Math.round(B / stepS),
      extendSampleStepMs: +(sampleS * 1000).toFixed(3),
      engineDecodeTokensPerS: Math.round((B * steps) / (eN - e1)),
      engineStepMs: +(((eN - e1) / steps) * 1000).toFixed(3),
      extendProfileMs: prof,
    }),
  );
}
model.dispose();
