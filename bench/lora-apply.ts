// How the built-in engine should apply a LoRA policy version (issue #52 item 1: "merged into its weights in place or
// as a LoRA-aware matmul, measure both, keep the faster"), measured on the native core at SmolLM2-135M's shape with
// rank-16 adapters on all seven projections:
// - merged: decode steps of a plain model whose weights hold the adapters folded in, plus the swap a new version
//   costs (the folded adapter out, the new one in: producers/policy/native-backend.ts, two mergeAdapter calls);
// - LoRA-aware: decode steps of a model that keeps the adapters beside the frozen weights and applies x A^T B^T in
//   every projection (the native core's lora_forward), where a new version costs loading the adapters alone.
// The two models decode the same batch from the same prompts in interleaved rounds (bench/harness.ts); a decode
// step is Model.extend of one token in each of --batch slots. The cost of a version either way is per version,
// that of the LoRA-aware step per decode step: break-even = swap ms / (LoRA-aware step − merged step) steps.
//   npm run bench -- lora-apply [--batch 16] [--context 128] [--steps 16] [--threads N] [--rounds 3] [--quick]
import { mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { nativeAvailable } from '../native/addon.ts';
import { LORA_TARGETS } from '../native/lora.ts';
import { Model } from '../native/model.ts';
import { int, parseFlags, ROUND_FLAGS } from './flags.ts';
import { SMOLLM2_135M } from './shapes.ts';
import { fmtStats, interleaved, probeSummary, summarize } from './harness.ts';

const LORA = { rank: 16, alpha: 32, targets: [...LORA_TARGETS] };

interface Result {
  stepMs: number;
  /** What a new version cost this mode: the swap (merged) or loading the adapters (LoRA-aware). */
  versionMs: number;
}

export async function main(args: string[]): Promise<unknown> {
  const { values: o } = parseFlags(args, { ...ROUND_FLAGS, batch: int(1), context: int(1), steps: int(1), threads: int(1) });
  if (!nativeAvailable()) throw new Error('lora-apply: the native addon is not built (npm run build:native)');
  const B = o.batch ?? 16;
  const context = o.context ?? 128;
  const steps = o.quick ? 4 : (o.steps ?? 16);
  const rounds = o.quick ? 1 : (o.rounds ?? 3);
  const threads = o.threads ?? availableParallelism();
  const dir = mkdtempSync(join(tmpdir(), 'rls-lora-apply-'));
  try {
    // Two adapter versions with non-zero B (a fresh adapter's B is zero and folds in as nothing).
    const lora = Model.init(SMOLLM2_135M, { seed: 1, threads, initStd: 0.02, lora: LORA });
    const basePath = join(dir, 'base.safetensors');
    await lora.saveBase(basePath);
    const adapters: string[] = [];
    for (const v of [1, 2]) {
      let x = v * 7919;
      for (const [n, t] of lora.adapter()) if (n.includes('lora_B')) for (let i = 0; i < t.data.length; i++) t.data[i] = ((x = (x * 48271) % 2147483647) / 2147483647 - 0.5) * 0.01;
      adapters.push(join(dir, `v${v}.safetensors`));
      await lora.saveAdapter(adapters[v - 1]!);
    }
    const merged = Model.load(basePath, SMOLLM2_135M, { threads, trainable: false });
    await merged.mergeAdapter(adapters[0]!);
    let folded = 0;
    let seed = 7;
    const tokens = (n: number) => Int32Array.from({ length: n }, () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % SMOLLM2_135M.vocab_size);
    const prompts = tokens(B * context);
    const decode = async (m: Model): Promise<number> => {
      m.kvReserve(B, context + steps + 1);
      for (let b = 0; b < B; b++) m.kvTruncate(b, 0);
      await m.extend(Int32Array.from({ length: B }, (_, i) => i), new Int32Array(B).fill(context), prompts);
      const slots = Int32Array.from({ length: B }, (_, i) => i);
      const ones = new Int32Array(B).fill(1);
      const t0 = performance.now();
      for (let i = 0; i < steps; i++) await m.extend(slots, ones, tokens(B));
      return (performance.now() - t0) / steps;
    };
    const records = await interleaved<Result>(
      [
        {
          name: 'merged',
          run: async () => {
            const t0 = performance.now();
            await merged.mergeAdapter(adapters[folded]!, -1);
            folded = 1 - folded;
            await merged.mergeAdapter(adapters[folded]!);
            const versionMs = performance.now() - t0;
            return { stepMs: await decode(merged), versionMs };
          },
        },
        {
          name: 'lora-aware',
          run: async () => {
            const t0 = performance.now();
            await lora.loadAdapter(adapters[folded]!);
            const versionMs = performance.now() - t0;
            return { stepMs: await decode(lora), versionMs };
          },
        },
      ],
      rounds,
    );
    const step = summarize(records, (r) => r.stepMs);
    const version = summarize(records, (r) => r.versionMs);
    const extra = step['lora-aware']!.median - step['merged']!.median;
    const breakEven = extra > 0 ? Math.ceil(version['merged']!.median / extra) : null;
    console.log(`decode step, batch ${B} at ${context} tokens (${steps} steps, ${threads} threads): merged ${fmtStats(step['merged']!, 2, ' ms')}, LoRA-aware ${fmtStats(step['lora-aware']!, 2, ' ms')}`);
    console.log(`a new version: swap (merged) ${fmtStats(version['merged']!, 1, ' ms')}, adapters loaded (LoRA-aware) ${fmtStats(version['lora-aware']!, 1, ' ms')}`);
    console.log(breakEven === null ? 'the LoRA-aware step was not slower: no break-even' : `merging pays for itself after ${breakEven} decode steps a version`);
    merged.dispose();
    lora.dispose();
    return { shape: 'SmolLM2-135M', lora: LORA, batch: B, context, steps, threads, stepMs: step, versionMs: version, breakEvenSteps: breakEven, probes: probeSummary(records), records };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
