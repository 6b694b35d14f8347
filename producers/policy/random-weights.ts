// Seeded random weights for a model config, in HF tensor names: for tests and benchmarks when no trained
// checkpoint (or native Model) is at hand. Scales follow the usual N(0, 0.02) init so logits stay O(1).
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { expectedTensors } from './tensors.ts';
import { Rng } from './sampler.ts';

export function randomWeights(c: ParsedModelConfig, seed = 0, std = 0.02): TensorMap {
  const rng = new Rng(seed);
  const out: TensorMap = new Map();
  for (const [name, shape] of expectedTensors(c)) {
    const n = shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    if (name.endsWith('norm.weight')) {
      // Near-one norm gains, perturbed so a wrong norm placement shows up in parity tests.
      for (let i = 0; i < n; i++) data[i] = 1 + 0.1 * rng.normal();
    } else if (name === 'model.embed_tokens.weight' || name === 'lm_head.weight') {
      // Larger embeddings give a peaked, non-uniform next-token distribution, which sampling tests need.
      for (let i = 0; i < n; i++) data[i] = rng.normal() * 0.5;
    } else {
      for (let i = 0; i < n; i++) data[i] = rng.normal() * (name.endsWith('.bias') ? 0.1 : std * 5);
    }
    out.set(name, { shape: [...shape], data });
  }
  return out;
}
