// rlstream's side of test/gpu/hf_parity.py: the directories of each variant (DIR/<name>, DIR/<name>-bf16: written by
// transformers, or by `rlstream import gguf` for the real model) loaded through `model.base`'s loader, on the CPU (fp32) and on CUDA (bf16 products): per-token log-probs of the
// packed sequences, the next-token distribution after each sequence's last token (a prefill through the KV cache),
// the policy-loss gradient (PPO at ratio 1, token-mean; written as ours-grads-<family>-<run>.safetensors), 48 greedy
// tokens after each prompt through the KV cache; and, on the CPU, one AdamW step exported by the export writer to
// DIR/exported/<name> with the trained model's log-probs, for transformers to load back. Adds to DIR/rlstream.json.
//   node --import tsx test/gpu/hf-parity.ts DIR [cpu,cuda] [NAMES]   # NAMES: default every one in reference.json
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeHfDir } from '../../core/weights/hf-dir.ts';
import { parseModelConfig } from '../../core/weights/model-config.ts';
import { writeSafetensors } from '../../core/weights/safetensors.ts';
import { cudaAvailable, Model, type DeviceKind } from '../../native/index.ts';

const root = process.argv[2]!;
const devices = (process.argv[3] ?? 'cpu,cuda').split(',') as DeviceKind[];
const ref = JSON.parse(readFileSync(join(root, 'reference.json'), 'utf8')) as { seqs: number[][]; advantages: number[][]; prompts: number[][]; families: Record<string, unknown> };
const { seqs, advantages, prompts } = ref;
const names = process.argv[4] ? process.argv[4].split(',') : Object.keys(ref.families);

function packed() {
  const tokens = Int32Array.from(seqs.flat());
  const seqStarts = Int32Array.from([0, ...seqs.map((_, i) => seqs.slice(0, i + 1).reduce((n, s) => n + s.length, 0))]);
  const targets = new Int32Array(tokens.length).fill(-1);
  const adv = new Float32Array(tokens.length);
  const mask = new Float32Array(tokens.length);
  seqs.forEach((s, i) =>
    s.slice(1).forEach((tok, j) => {
      const t = seqStarts[i]! + j;
      targets[t] = tok;
      adv[t] = advantages[i]![j]!;
      mask[t] = advantages[i]![j]! !== 0 ? 1 : 0;
    }),
  );
  return { batch: { tokens, seqStarts }, targets, adv, mask };
}

function split(lp: Float32Array, seqStarts: Int32Array): number[][] {
  return seqs.map((s, i) => Array.from(lp.subarray(seqStarts[i]!, seqStarts[i]! + s.length - 1)));
}

async function score(model: Model): Promise<number[][]> {
  const { batch, targets } = packed();
  return split((await model.forward(batch, targets)).logprobs, batch.seqStarts);
}

async function run(dir: string, device: DeviceKind, withGrad: boolean, gradFile: string | null) {
  const cfg = parseModelConfig(readFileSync(join(dir, 'config.json'), 'utf8'));
  const model = Model.load(dir, cfg, { device, threads: 16, trainable: withGrad });
  const { batch, targets, adv, mask } = packed();
  const fwd = await model.forward(batch, targets);
  const logprobs = split(fwd.logprobs, batch.seqStarts);
  // the whole next-token distribution after each sequence's last token: one prefill per sequence through the cache
  model.kvReserve(seqs.length, Math.min(512, cfg.max_position_embeddings));
  const rows = await model.extend(Int32Array.from(seqs.map((_, i) => i)), Int32Array.from(seqs.map((s) => s.length)), batch.tokens, new Float32Array(seqs.length).fill(1));
  const V = cfg.vocab_size;
  const last = seqs.map((_, i) => Array.from(rows.subarray(i * V, (i + 1) * V), (p) => Math.log(p)));
  // greedy: the arg-max at every step through the KV cache
  const greedy: number[][] = [];
  for (const p of prompts) {
    model.kvReserve(1, 128);
    let probs = await model.extend(Int32Array.of(0), Int32Array.of(p.length), Int32Array.from(p), Float32Array.of(1));
    const out: number[] = [];
    for (let i = 0; i < 48; i++) {
      let best = 0;
      for (let v = 1; v < V; v++) if (probs[v]! > probs[best]!) best = v;
      out.push(best);
      probs = await model.extend(Int32Array.of(0), Int32Array.of(1), Int32Array.of(best), Float32Array.of(1));
    }
    greedy.push(out);
  }
  if (withGrad && gradFile) {
    model.zeroGrad();
    // behaviour log-probs = the model's own: ratio 1, nothing clipped, d loss = -mean(A d log p)
    await model.backwardPolicyLoss(batch, { targets, responseMask: mask, advantages: adv, behaviourLogprobs: fwd.logprobs }, { loss: 'ppo', clipLow: 0.2, clipHigh: 0.2, iwCap: null, aggregation: 'token-mean' });
    await writeSafetensors(gradFile, model.gradients());
  }
  return { model, result: { logprobs, last, greedy } };
}

const outFile = join(root, 'rlstream.json');
const results = existsSync(outFile) ? (JSON.parse(readFileSync(outFile, 'utf8')) as { families: Record<string, Record<string, unknown>> }).families : {};
for (const fam of names) {
  const r: Record<string, unknown> = {};
  for (const device of devices) {
    if (device === 'cuda' && !cudaAvailable()) continue;
    const t0 = Date.now();
    const { model, result } = await run(join(root, fam), device, true, join(root, `ours-grads-${fam}-${device}.safetensors`));
    r[device] = { ...result, seconds: (Date.now() - t0) / 1000 };
    if (device === 'cpu') {
      // one AdamW step on that gradient, exported as `rlstream export` writes a version, and scored here
      await model.adamwStep({ lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0 });
      // shards of 2 MB for the random models, about six for the real one
      const params = model.parameters();
      const bytes = [...params.values()].reduce((n, t) => n + t.data.length * 4, 0);
      await writeHfDir(join(root, 'exported', fam), { tensors: params }, { configJson: readFileSync(join(root, fam, 'config.json'), 'utf8'), dtype: 'F32', maxShardBytes: Math.max(2e6, Math.ceil(bytes / 6)), generationConfig: { eos_token_id: 2 }, force: true });
      r['export_logprobs'] = await score(model);
    }
    model.dispose();
    console.log(`hf-parity: ${fam} on ${device}: ${(Date.now() - t0) / 1000} s`);
  }
  if (devices.includes('cuda') && cudaAvailable()) {
    const { model, result } = await run(join(root, `${fam}-bf16`), 'cuda', false, null);
    r['cuda-bf16'] = result;
    model.dispose();
    // the CUDA layer's plain ops (RLSTREAM_CUDA_FUSED=0, read as a model's kernels are made): the q/k norms of its
    // unfused forward and backward
    process.env['RLSTREAM_CUDA_FUSED'] = '0';
    const plain = await run(join(root, fam), 'cuda', true, join(root, `ours-grads-${fam}-cuda-plain.safetensors`));
    delete process.env['RLSTREAM_CUDA_FUSED'];
    r['cuda-plain'] = plain.result;
    plain.model.dispose();
  }
  results[fam] = r;
  writeFileSync(outFile, JSON.stringify({ node: process.version, families: results }));
}
console.log('hf-parity: wrote', outFile);
