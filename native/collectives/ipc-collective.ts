// The reference collective across processes: the ranks of `rlstream run` with trainer.devices > 1 and
// data_parallel.collective 'reference' are processes (launcher.ts), and they meet in rank 0's process, where the
// in-process reference group (reference-collective.ts) does the arithmetic: rank 0 calls its member directly, every
// other rank sends its call over the launcher's IPC channel and gets the result back. So the cross-process ranks
// compute exactly what the in-process reference computes (sums in rank order, in fp32), which the CPU tests check
// against one process. NCCL is the collective for GPU models; this one is for CPU models (and the tests of the
// launcher that CI can run without GPUs).
import { RlstreamError } from '../../core/errors.ts';
import { HostCollective, RankFailed, type Collective, type CollectiveBuffer } from './collective.ts';

/** One collective call of a rank in another process: the buffers travel by value (copies). */
export type CollectiveCall =
  | { op: 'allReduce'; buckets: CollectiveBuffer[] }
  | { op: 'reduceScatter'; send: CollectiveBuffer; recv: CollectiveBuffer }
  | { op: 'allGather'; send: CollectiveBuffer; recv: CollectiveBuffer }
  | { op: 'broadcast'; buf: CollectiveBuffer; root: number };

/** A call's result: the buffers it writes, in the call's order (allReduce: every bucket; the others: recv or buf). */
export type CollectiveResult = CollectiveBuffer[];

/** What a rank process sends its parent, and gets back, for collectives. */
export type CollectiveMessage =
  | { t: 'coll'; seq: number; call: CollectiveCall }
  | { t: 'coll-abort'; reason: string };
export type CollectiveReply = { t: 'coll-done'; seq: number; result: CollectiveResult } | { t: 'coll-failed'; seq: number; failedRank: number; reason: string };

/**
 * Rank 0's side: runs a remote rank's call on that rank's member of the in-process group and returns what the call
 * wrote. The group's own checks (mismatched calls, lengths) apply as they do in one process.
 */
export async function serveCall(member: Collective, call: CollectiveCall): Promise<CollectiveResult> {
  switch (call.op) {
    case 'allReduce':
      await member.allReduce(call.buckets);
      return call.buckets;
    case 'reduceScatter':
      await member.reduceScatter(call.send, call.recv);
      return [call.recv];
    case 'allGather':
      await member.allGather(call.send, call.recv);
      return [call.recv];
    case 'broadcast':
      await member.broadcast(call.buf, call.root);
      return [call.buf];
  }
}

/** A copy of exactly the view's elements: a subarray would carry its whole backing buffer over the channel. */
function copy<T extends CollectiveBuffer>(b: T): T {
  return b.slice() as T;
}

/**
 * A rank in a child process: every call goes to rank 0's process in the order it is made, and resolves when the
 * results are back in the caller's buffers. `send` is the process channel (process.send).
 */
export class IpcCollective extends HostCollective {
  readonly kind = 'reference';
  private seq = 0;
  private readonly waiting = new Map<number, { resolve: (r: CollectiveResult) => void; reject: (e: unknown) => void }>();
  private failed: RankFailed | null = null;

  constructor(
    readonly rank: number,
    readonly size: number,
    private readonly send: (m: CollectiveMessage) => void,
  ) {
    super();
  }

  /** A reply from rank 0's process (the launcher's channel hands every coll-* message here). */
  onReply(m: CollectiveReply): void {
    const w = this.waiting.get(m.seq);
    if (!w) return;
    this.waiting.delete(m.seq);
    if (m.t === 'coll-done') w.resolve(m.result);
    else w.reject(new RankFailed(m.failedRank, new Error(m.reason)));
  }

  private call(call: CollectiveCall, into: CollectiveBuffer[]): Promise<void> {
    if (this.failed) return Promise.reject(this.failed);
    const seq = this.seq++;
    const done = new Promise<CollectiveResult>((resolve, reject) => this.waiting.set(seq, { resolve, reject }));
    this.send({ t: 'coll', seq, call });
    return done.then((result) => {
      if (result.length !== into.length) throw new RlstreamError('INTERNAL', `collective #${seq}: ${result.length} result buffer(s) for ${into.length}`);
      result.forEach((r, i) => (into[i] as Float32Array).set(r as Float32Array));
    });
  }

  allReduce(buckets: readonly CollectiveBuffer[]): Promise<void> {
    return this.call({ op: 'allReduce', buckets: buckets.map(copy) }, [...buckets]);
  }
  reduceScatter(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void> {
    return this.call({ op: 'reduceScatter', send: copy(send), recv: copy(recv) }, [recv]);
  }
  allGather(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void> {
    return this.call({ op: 'allGather', send: copy(send), recv: copy(recv) }, [recv]);
  }
  broadcast(buf: CollectiveBuffer, root: number): Promise<void> {
    return this.call({ op: 'broadcast', buf: copy(buf), root }, [buf]);
  }
  abort(reason: unknown): void {
    if (this.failed) return;
    this.failed = reason instanceof RankFailed ? reason : new RankFailed(this.rank, reason);
    for (const w of this.waiting.values()) w.reject(this.failed);
    this.waiting.clear();
    // the group in rank 0's process fails every rank's pending and later calls, naming the first rank that failed
    if (!(reason instanceof RankFailed && reason.failedRank !== this.rank)) this.send({ t: 'coll-abort', reason: reason instanceof Error ? reason.message : String(reason) });
  }
  async close(): Promise<void> {
    this.abort(new Error(`rank ${this.rank} closed its collective`));
  }
}
