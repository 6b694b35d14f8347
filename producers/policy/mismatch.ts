// The rollout–trainer log-prob mismatch: how far the behaviour log-probs recorded at sampling time are from the
// log-probs the trainer recomputes for the same tokens and weights. Pure numerics when both sides are right
// (different kernels, batch shapes, precisions); a large value means a bug or a version mix-up. The trainer
// publishes it with every TrainStep.
import { RlstreamError } from '../../core/errors.ts';

export interface LogprobMismatch {
  /** Tokens compared (mask 1). */
  count: number;
  /** mean |Δ| over compared tokens. */
  meanAbs: number;
  /** max |Δ|. */
  maxAbs: number;
  /** mean (behaviour − recomputed): a sign shows a systematic bias, e.g. a forgotten temperature. */
  meanSigned: number;
}

/**
 * Compare per-token log-probs. `mask` (optional, same length) selects the tokens that count (assistant tokens
 * with loss mask 1); tokens where either side is not finite are an error, not a silent skip.
 */
export function logprobMismatch(behaviour: ArrayLike<number>, recomputed: ArrayLike<number>, mask?: ArrayLike<number>): LogprobMismatch {
  if (behaviour.length !== recomputed.length || (mask && mask.length !== behaviour.length)) {
    throw new RlstreamError('INPUT_INVALID', `log-prob arrays differ in length: ${behaviour.length} behaviour, ${recomputed.length} recomputed${mask ? `, ${mask.length} mask` : ''}`);
  }
  let count = 0;
  let sumAbs = 0;
  let sum = 0;
  let maxAbs = 0;
  for (let i = 0; i < behaviour.length; i++) {
    if (mask && !mask[i]) continue;
    const a = behaviour[i]!;
    const b = recomputed[i]!;
    if (!Number.isFinite(a) || !Number.isFinite(b)) throw new RlstreamError('INPUT_INVALID', `non-finite log-prob at token ${i}: behaviour ${a}, recomputed ${b}`);
    const d = a - b;
    count++;
    sum += d;
    sumAbs += Math.abs(d);
    if (Math.abs(d) > maxAbs) maxAbs = Math.abs(d);
  }
  return { count, meanAbs: count ? sumAbs / count : 0, maxAbs, meanSigned: count ? sum / count : 0 };
}
