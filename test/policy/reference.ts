// The ONNX export's check: log-softmax of the model's logits at every position, from native/reference.ts, the
// project's independent float64 forward (written from the model definition, not from the exporter or the C++).
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { referenceLogits, toReferenceParams } from '../../native/reference.ts';

/** Log-softmax of the logits at every position of `tokens` (positions 0..n-1): [n][vocab]. */
export function referenceLogprobs(c: ParsedModelConfig, wts: TensorMap, tokens: number[]): Float64Array[] {
  const logits = referenceLogits(c, toReferenceParams(wts), { tokens: Int32Array.from(tokens), seqStarts: Int32Array.from([0, tokens.length]) });
  const V = c.vocab_size;
  return tokens.map((_, t) => {
    const row = logits.subarray(t * V, (t + 1) * V);
    let max = -Infinity;
    for (const v of row) max = Math.max(max, v);
    let sum = 0;
    for (const v of row) sum += Math.exp(v - max);
    const lz = max + Math.log(sum);
    return row.map((v) => v - lz);
  });
}
