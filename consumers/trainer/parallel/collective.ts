// The collective operations data-parallel training needs, as one interface with two implementations: the
// in-process reference (reference-collective.ts: N simulated ranks, for the CPU tests) and NCCL through the native
// core (nccl-collective.ts). A rank's code is written once against this interface; which one runs is chosen by
// name from `collectives`.
import { RlstreamError } from '../../../core/errors.ts';

/** Element types of a collective buffer: fp32 as Float32Array, bf16 as its bit patterns in a Uint16Array. */
export type CollectiveDtype = 'fp32' | 'bf16';
export type CollectiveBuffer = Float32Array | Uint16Array;

export function dtypeOf(b: CollectiveBuffer): CollectiveDtype {
  return b instanceof Float32Array ? 'fp32' : 'bf16';
}

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
   * This rank failed: every collective pending or issued later, on every rank, rejects with RankFailed naming it,
   * so no rank waits forever on a peer that will not come.
   */
  abort(reason: unknown): void;
  close(): Promise<void>;
}

/** A collective could not complete because a rank failed (or left): the step it belonged to did not happen. */
export class RankFailed extends RlstreamError {
  constructor(
    readonly failedRank: number,
    readonly reason: unknown,
  ) {
    super('INTERNAL', `data-parallel rank ${failedRank} failed: ${reason instanceof Error ? reason.message : String(reason)}; the step is abandoned (nothing committed) and resumes from the last committed one`, { cause: reason });
  }
}

/** Refusals of buffers that do not fit the operation (lengths, types), naming the operation and the counts. */
export function checkSameDtype(op: string, a: CollectiveBuffer, b: CollectiveBuffer): void {
  if (dtypeOf(a) !== dtypeOf(b)) throw new RlstreamError('INPUT_INVALID', `${op}: send is ${dtypeOf(a)} and recv is ${dtypeOf(b)}; both must be the same type`);
}
