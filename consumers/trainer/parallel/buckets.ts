// Gradient buckets: the flat gradient vector cut into consecutive ranges of at most `bucketBytes` (in the
// reduction's element type), each all-reduced as one buffer. Buckets run from the end of the vector to its start:
// the backward pass produces the last layers' gradients first, so that is the order in which a backward hook would
// hand them to the collective while the pass goes on. That overlap needs a hook in the native backward pass, which
// is not built: allReduceGradients reduces every bucket after the pass (docs/scaling.md).
import { RlstreamError } from '../../../core/errors.ts';
import { fromBf16, toBf16 } from '../../../native/collectives/bf16.ts';
import type { Collective, CollectiveBuffer, CollectiveDtype } from '../../../native/collectives/collective.ts';
import { FlatLayout } from './flat.ts';

export interface BucketPlan {
  dtype: CollectiveDtype;
  /** [start, end) ranges of the flat vector, last range of the vector first. */
  ranges: [number, number][];
}

const BYTES: Record<CollectiveDtype, number> = { fp32: 4, bf16: 2 };

export function planBuckets(numel: number, bucketBytes: number, dtype: CollectiveDtype): BucketPlan {
  if (!Number.isInteger(bucketBytes) || bucketBytes < BYTES[dtype]) throw new RlstreamError('INPUT_INVALID', `bucket size ${bucketBytes} bytes holds no ${dtype} element (${BYTES[dtype]} bytes); give at least ${BYTES[dtype]}`);
  const per = Math.floor(bucketBytes / BYTES[dtype]);
  const ranges: [number, number][] = [];
  for (let end = numel; end > 0; end -= per) ranges.push([Math.max(0, end - per), end]);
  return { dtype, ranges };
}

/**
 * Sums the gradients held by `tensors` across the ranks, in place, bucket by bucket. In bf16 each rank's
 * gradient is rounded to bf16 before the sum and the sum is rounded again: what a bf16 reduction costs in
 * precision, which the caller chose for half the bytes.
 */
export async function allReduceGradients(collective: Collective, layout: FlatLayout, tensors: readonly Float32Array[], plan: BucketPlan): Promise<void> {
  const staged = plan.ranges.map(([s, e]) => {
    const f = new Float32Array(e - s);
    layout.read(tensors, s, e, f);
    return f;
  });
  const buffers: CollectiveBuffer[] = plan.dtype === 'fp32' ? staged : staged.map((f) => toBf16(f));
  await collective.allReduce(buffers);
  plan.ranges.forEach(([s, e], b) => layout.write(tensors, s, e, plan.dtype === 'fp32' ? staged[b]! : fromBf16(buffers[b] as Uint16Array)));
}
