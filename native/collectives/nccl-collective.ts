// The Collective over NCCL, which the native core loads at run time (native/src/nccl.cpp: dlopen of libnccl.so.2 or
// RLSTREAM_NCCL_LIBRARY). One process per rank, one GPU each: rank 0 makes the unique id (ncclUniqueId()) and hands
// it to the other ranks' processes out of band (the launcher passes it, as torchrun's store does); every rank then
// joins with NcclCollective.join. Where NCCL, the CUDA layer or a GPU is missing, join refuses, naming which.
import { RlstreamError } from '../../core/errors.ts';
import { loadedAddon, type NativeModelHandle } from '../addon.ts';
import type { Model } from '../index.ts';
import { hostBlocks, RankFailed, type Collective, type CollectiveBuffer, type ModelBlock } from './collective.ts';

type BlockOp = 'allReduce' | 'broadcast' | 'allGather' | 'reduceScatter';

interface NcclNative {
  probe(): { library: string; version: number | null; error: string | null };
  uniqueId(): Uint8Array;
  commInit(id: Uint8Array, ranks: number, rank: number, device: number): number;
  commDestroy(comm: number, abort: boolean): void;
  allReduce(comm: number, buf: CollectiveBuffer): Promise<void>;
  broadcast(comm: number, buf: CollectiveBuffer, root: number): Promise<void>;
  allGather(comm: number, send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void>;
  reduceScatter(comm: number, send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void>;
  /** Queues a collective over a GPU model's own block on its stream (native/src/nccl.cpp); returns once queued. */
  blockCollective(comm: number, op: BlockOp, model: NativeModelHandle, block: ModelBlock, sendBegin: number, sendCount: number, recvBegin: number, recvCount: number, root: number): void;
}

export interface NcclStatus {
  /** Whether communicators can be made here. */
  usable: boolean;
  /** The library asked for, its version (NCCL's integer, e.g. 22304 for 2.23.4) where it loaded. */
  library: string | null;
  version: number | null;
  /** Why it is not usable, naming what is missing. */
  reason: string | null;
}

function nccl(): NcclNative | null {
  return (loadedAddon() as unknown as { nccl?: NcclNative } | null)?.nccl ?? null;
}

export function ncclStatus(): NcclStatus {
  const n = nccl();
  if (n === null) return { usable: false, library: null, version: null, reason: loadedAddon() === null ? 'the native addon is not built here (npm run build:native)' : 'this native addon was built before NCCL support (rebuild it: npm run build:native)' };
  const p = n.probe();
  return { usable: p.error === null, library: p.library, version: p.version, reason: p.error };
}

function usable(): NcclNative {
  const s = ncclStatus();
  if (!s.usable) throw new RlstreamError('NATIVE_INVALID_ARGUMENT', `NCCL cannot run here: ${s.reason}`);
  return nccl()!;
}

/** Rank 0's part of the rendezvous: the 128-byte id every rank joins with. */
export function ncclUniqueId(): Uint8Array {
  return usable().uniqueId();
}

export class NcclCollective implements Collective {
  readonly kind = 'nccl';
  private failed: RankFailed | null = null;
  private comm: number | null;

  private constructor(
    private readonly n: NcclNative,
    comm: number,
    readonly rank: number,
    readonly size: number,
  ) {
    this.comm = comm;
  }

  /** Joins the group of `size` ranks as `rank` on GPU `device`; returns when every rank has joined. */
  static join(id: Uint8Array, size: number, rank: number, device: number): NcclCollective {
    const n = usable();
    return new NcclCollective(n, n.commInit(id, size, rank, device), rank, size);
  }

  private live(): number {
    if (this.failed) throw this.failed;
    if (this.comm === null) throw new RlstreamError('INPUT_INVALID', `NCCL rank ${this.rank}: the communicator is closed`);
    return this.comm;
  }

  private async guard(fn: (comm: number) => Promise<void>): Promise<void> {
    try {
      await fn(this.live());
    } catch (err) {
      // an NCCL error on one rank (a peer gone, a timeout) leaves the communicator unusable: abort it, and name it
      this.abort(err);
      throw this.failed ?? err;
    }
  }

  allReduce(buckets: readonly CollectiveBuffer[]): Promise<void> {
    // one after another: each is a job on the thread pool, and NCCL needs every rank to issue them in one order
    return this.guard(async (c) => {
      for (const b of buckets) await this.n.allReduce(c, b);
    });
  }
  reduceScatter(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void> {
    return this.guard((c) => this.n.reduceScatter(c, send, recv));
  }
  allGather(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void> {
    return this.guard((c) => this.n.allGather(c, send, recv));
  }
  broadcast(buf: CollectiveBuffer, root: number): Promise<void> {
    return this.guard((c) => this.n.broadcast(c, buf, root));
  }
  // A GPU model's blocks are reduced where they are, queued behind its kernels: the model's next call (and any
  // value it reads back) comes after the collective. A CPU model's go through the host-staged calls above.
  private onDevice(model: Model, op: BlockOp, block: ModelBlock, send: [number, number], recv: [number, number], root: number): Promise<void> {
    return this.guard(async (c) => this.n.blockCollective(c, op, model.nativeHandle(`${op}Block`), block, send[0], send[1], recv[0], recv[1], root));
  }
  allReduceBlock(model: Model, block: ModelBlock, begin: number, count: number): Promise<void> {
    if (model.device !== 'cuda') return hostBlocks.allReduce(this, model, block, begin, count);
    return this.onDevice(model, 'allReduce', block, [begin, count], [begin, count], 0);
  }
  allGatherBlock(model: Model, block: ModelBlock, begin: number, chunk: number): Promise<void> {
    if (model.device !== 'cuda') return hostBlocks.allGather(this, model, block, begin, chunk);
    return this.onDevice(model, 'allGather', block, [begin + this.rank * chunk, chunk], [begin, chunk * this.size], 0);
  }
  broadcastBlock(model: Model, block: ModelBlock, begin: number, count: number, root: number): Promise<void> {
    if (model.device !== 'cuda') return hostBlocks.broadcast(this, model, block, begin, count, root);
    return this.onDevice(model, 'broadcast', block, [begin, count], [begin, count], root);
  }
  abort(reason: unknown): void {
    if (this.failed) return;
    this.failed = reason instanceof RankFailed ? reason : new RankFailed(this.rank, reason);
    if (this.comm !== null) this.n.commDestroy(this.comm, true);
    this.comm = null;
  }
  async close(): Promise<void> {
    if (this.comm !== null) this.n.commDestroy(this.comm, false);
    this.comm = null;
  }
}
