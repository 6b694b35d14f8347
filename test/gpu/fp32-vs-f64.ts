// The scale of fp32 arithmetic on a model directory: rlstream's CPU forward (fp32) against the float64 reference
// (native/reference.ts) on the same weights, per-token log-probs of random sequences. Runs anywhere the addon is
// built; the reference is slow (a 39-token sequence of SmolLM2-135M: about 45 s).
//   node --import tsx test/gpu/fp32-vs-f64.ts DIR [LENGTHS]    # LENGTHS: comma-separated, default 39
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseModelConfig } from '../../core/weights/model-config.ts';
import { Model } from '../../native/index.ts';
import { referenceForward, toReferenceParams } from '../../native/reference.ts';
import { pack, randomSeqs, rng } from '../native/helpers.ts';

const dir = process.argv[2]!;
const lengths = (process.argv[3] ?? '39').split(',').map(Number);
const cfg = parseModelConfig(readFileSync(join(dir, 'config.json'), 'utf8'));
const model = Model.load(dir, cfg, { threads: 2, trainable: false });
const { batch, targets } = pack(randomSeqs(rng(7), lengths, Math.min(1024, cfg.vocab_size)));
const ours = (await model.forward(batch, targets)).logprobs;
const started = Date.now();
const ref = referenceForward(cfg, toReferenceParams(model.parameters()), batch, targets).logprobs;
let worst = 0;
let n = 0;
for (let i = 0; i < ours.length; i++) {
  if (targets[i]! < 0) continue;
  worst = Math.max(worst, Math.abs(ours[i]! - ref[i]!));
  n++;
}
model.dispose();
console.log(JSON.stringify({ dir, lengths, tokens: n, logprob_max_abs_fp32_vs_float64: worst, reference_seconds: (Date.now() - started) / 1000 }));
