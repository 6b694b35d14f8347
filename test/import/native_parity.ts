// The native core's forward on an imported model against transformers' log-probs of the same tokens:
//   python test/import/gguf_parity.py <model.gguf> <dir> --dump ref.json
//   npx tsx test/import/native_parity.ts <dir> ref.json [cpu|cuda]
// Prints one JSON line with the max abs difference of the next-token log-probs over every position.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Model, parseModelConfig } from '../../native/index.ts';

const [dir, refPath, device = 'cpu'] = process.argv.slice(2);
if (!dir || !refPath || (device !== 'cpu' && device !== 'cuda')) {
  console.error('usage: native_parity.ts <imported dir> <ref.json from gguf_parity.py --dump> [cpu|cuda]');
  process.exit(2);
}
const ref = JSON.parse(readFileSync(refPath, 'utf8')) as { sequences: { ids: number[]; logprobs: number[] }[] };
const config = parseModelConfig(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')));
const model = Model.load(join(dir, 'model.safetensors'), config, { device });
const tokens: number[] = [];
const targets: number[] = [];
const expected: number[] = [];
const starts = [0];
for (const s of ref.sequences) {
  s.ids.forEach((id, i) => {
    tokens.push(id);
    targets.push(i + 1 < s.ids.length ? s.ids[i + 1]! : -1);
    expected.push(i + 1 < s.ids.length ? s.logprobs[i]! : 0);
  });
  starts.push(tokens.length);
}
const { logprobs } = await model.forward({ tokens: Int32Array.from(tokens), seqStarts: Int32Array.from(starts) }, Int32Array.from(targets));
let maxDiff = 0;
let sumRef = 0;
for (let t = 0; t < tokens.length; t++) {
  if (targets[t] === -1) continue;
  maxDiff = Math.max(maxDiff, Math.abs(logprobs[t]! - expected[t]!));
  sumRef += expected[t]!;
}
model.dispose();
console.log(JSON.stringify({ device, sequences: ref.sequences.length, tokens: tokens.length, meanRefLogprob: sumRef / (tokens.length - ref.sequences.length), maxAbsLogprobDiff: maxDiff }));
