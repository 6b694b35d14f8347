// The collective operations data-parallel training needs, as one interface with two implementations: the
// in-process reference (reference-collective.ts: N simulated ranks, for the CPU tests) and NCCL through the native
// core (nccl-collective.ts). A rank's code is written once against this interface; which one runs is chosen by
// name from `collectives`.
import { RlstreamError } from '../../core/errors.ts';
import type { Model } from '../index.ts';

/** Element types of a collective buffer: fp32 as Float32Array, bf16 as its bit patterns in a Uint16Array. */
export type CollectiveDtype = 'fp32' | 'bf16';
export type CollectiveBuffer = Float32Array | Uint16Array;

export function dtypeOf(b: CollectiveBuffer): CollectiveDtype {
  return b instanceof Float32Array ? 'fp32' : 'bf16';
}

/** A model's own fp32 block that a collective reads and writes in place: its parameters or its gradients. */
export type ModelBlock = 'params' | 'grads';

export interface Collective {
  /** Which implementation ('reference', 'nccl'). */
  readonly kind: string;
  readonly rank: number;
  readonly size: number;
  /** Sums every bucket across the ranks, in place; the buckets are reduced in the order given. */
  allReduce(buckets: readonly CollectiveBuffer[]): Promise<void>;
  /** recv (send.length / size elements) = the sum over ranks of this rank's chunk of send. */
  reduceScatter(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void>;
  /** recv (send.length × size elements) = every rank's send, in rank order. */
  allGather(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void>;
  /** buf = root's buf on every rank. */
  broadcast(buf: CollectiveBuffer, root: number): Promise<void>;
  /**
   * Over a model's own block, in place, fp32 (floats counted from the block's start): on a GPU model queued on its
   * stream behind its kernels with no host copy, on a CPU model through its host view. Floats [begin, begin +
   * count) summed over the ranks.
   */
  allReduceBlock(model: Model, block: ModelBlock, begin: number, count: number): Promise<void>;
  /** Every rank's floats [begin + r × chunk, begin + (r + 1) × chunk) of the block, to every rank. */
  allGatherBlock(model: Model, block: ModelBlock, begin: number, chunk: number): Promise<void>;
  /** Root's floats [begin, begin + count) of the block, to every rank. */
  broadcastBlock(model: Model, block: ModelBlock, begin: number, count: number, root: number): Promise<void>;
  /**
   * This rank failed: every collective pending or issued later, on every rank, rejects with RankFailed naming it,
   * so no rank waits forever on a peer that will not come.
   */
  abort(reason: unknown): void;
  close(): Promise<void>;
}

/**
 * A collective could not complete because a rank failed (or left): the step it belonged to did not happen, unless
 * `committed` (rank 0 had committed it before the failure reached it: the step is in the log, the group is not).
 */
export class RankFailed extends RlstreamError {
  constructor(
    readonly failedRank: number,
    readonly reason: unknown,
    readonly committed = false,
  ) {
    const why = reason instanceof RankFailed ? (reason.reason instanceof Error ? reason.reason.message : String(reason.reason)) : reason instanceof Error ? reason.message : String(reason);
    super(
      'INTERNAL',
      committed
        ? `data-parallel rank ${failedRank} failed after the step was committed: ${why}; the step is in the log and the run resumes after it`
        : `data-parallel rank ${failedRank} failed: ${why}; the step is abandoned (nothing committed) and resumes from the last committed one`,
      { cause: reason },
    );
  }

  /** The same failure, known to have come after rank 0 committed the step. */
  afterCommit(): RankFailed {
    return this.committed ? this : new RankFailed(this.failedRank, this.reason, true);
  }
}

/** Refusals of buffers that do not fit the operation (lengths, types), naming the operation and the counts. */
export function checkSameDtype(op: string, a: CollectiveBuffer, b: CollectiveBuffer): void {
  if (dtypeOf(a) !== dtypeOf(b)) throw new RlstreamError('INPUT_INVALID', `${op}: send is ${dtypeOf(a)} and recv is ${dtypeOf(b)}; both must be the same type`);
}

/** Floats [begin, begin + count) of a CPU model's block, as a zero-copy view; refused outside the block. */
function hostRange(model: Model, block: ModelBlock, begin: number, count: number): Float32Array {
  const view = model.blockView(block);
  if (!Number.isInteger(begin) || !Number.isInteger(count) || begin < 0 || count < 0 || begin + count > view.length) {
    throw new RlstreamError('INPUT_INVALID', `[${begin}, ${begin + count}) is not inside the model's ${block} block of ${view.length} floats`);
  }
  return view.subarray(begin, begin + count);
}

/**
 * The block operations of a CPU model, through a collective's buffer operations on its host view (the model's own
 * memory there, so still in place): what the reference collective does, and NCCL for a CPU model.
 */
export const hostBlocks = {
  // async: a refused range rejects the promise, as the device path's refusals do, instead of throwing at the call
  allReduce: async (c: Collective, model: Model, block: ModelBlock, begin: number, count: number): Promise<void> => c.allReduce([hostRange(model, block, begin, count)]),
  allGather: async (c: Collective, model: Model, block: ModelBlock, begin: number, chunk: number): Promise<void> => {
    const all = hostRange(model, block, begin, chunk * c.size);
    return c.allGather(all.subarray(c.rank * chunk, (c.rank + 1) * chunk), all);
  },
  broadcast: async (c: Collective, model: Model, block: ModelBlock, begin: number, count: number, root: number): Promise<void> => c.broadcast(hostRange(model, block, begin, count), root),
};

/**
 * A collective whose ranks reach models through host memory only (the reference group, and its ranks in other
 * processes): the block operations go through the model's host view; a GPU model's blockView refuses, naming it.
 */
export abstract class HostCollective implements Collective {
  abstract readonly kind: string;
  abstract readonly rank: number;
  abstract readonly size: number;
  abstract allReduce(buckets: readonly CollectiveBuffer[]): Promise<void>;
  abstract reduceScatter(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void>;
  abstract allGather(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void>;
  abstract broadcast(buf: CollectiveBuffer, root: number): Promise<void>;
  abstract abort(reason: unknown): void;
  abstract close(): Promise<void>;
  allReduceBlock(model: Model, block: ModelBlock, begin: number, count: number): Promise<void> {
    return hostBlocks.allReduce(this, model, block, begin, count);
  }
  allGatherBlock(model: Model, block: ModelBlock, begin: number, chunk: number): Promise<void> {
    return hostBlocks.allGather(this, model, block, begin, chunk);
  }
  broadcastBlock(model: Model, block: ModelBlock, begin: number, count: number, root: number): Promise<void> {
    return hostBlocks.broadcast(this, model, block, begin, count, root);
  }
}
