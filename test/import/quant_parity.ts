// The reader's dequantization against gguf-py's on random blocks (made by test/import/quant_parity.py):
//   npx tsx test/import/quant_parity.ts <dir>
// Prints one JSON line: per type, the elements compared and the max abs difference.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { GgufFile } from '../../core/weights/gguf.ts';

const dir = process.argv[2];
if (!dir) {
  console.error('usage: quant_parity.ts <dir written by quant_parity.py>');
  process.exit(2);
}
const expected = JSON.parse(readFileSync(join(dir, 'expected.json'), 'utf8')) as Record<string, number[]>;
const file = GgufFile.open(join(dir, 'blocks.gguf'));
const result: Record<string, { elements: number; maxAbsDiff: number }> = {};
for (const t of file.tensors) {
  const got = file.readTensor(t);
  const want = expected[t.name]!;
  let diff = got.length === want.length ? 0 : Infinity;
  for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
  result[t.type.name] = { elements: got.length, maxAbsDiff: diff };
}
file.close();
console.log(JSON.stringify(result));
