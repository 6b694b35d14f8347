// The reference collective: N ranks in one process, each a Collective, meeting at every call. The k-th call of
// each rank is the k-th collective of the group; when every rank has made it, the operation runs once over all
// their buffers and every rank's promise settles. Ranks that call different operations (or the same one on
// buffers that do not match) at the same point get an error naming both, as a hung NCCL job would not.
// Arithmetic: a sum is taken in rank order (rank 0 first) in fp32; a bf16 sum is taken the same way in fp32 and
// rounded to bf16 once. NCCL's ring sums in another order (and rounds bf16 at every hop), so results agree with it
// within floating-point tolerance, not bit for bit; with one rank both return the input unchanged.
import { RlstreamError } from '../../core/errors.ts';
import { fromBf16Bits, toBf16Bits } from './bf16.ts';
import { checkSameDtype, dtypeOf, HostCollective, RankFailed, type Collective, type CollectiveBuffer } from './collective.ts';

type Call =
  | { op: 'allReduce'; buckets: readonly CollectiveBuffer[] }
  | { op: 'reduceScatter'; send: CollectiveBuffer; recv: CollectiveBuffer }
  | { op: 'allGather'; send: CollectiveBuffer; recv: CollectiveBuffer }
  | { op: 'broadcast'; buf: CollectiveBuffer; root: number };

interface Pending {
  calls: (Call | undefined)[];
  waiters: { resolve: () => void; reject: (e: unknown) => void }[];
}

class Group {
  private readonly pending = new Map<number, Pending>();
  private readonly seq: number[];
  failed: RankFailed | null = null;

  constructor(readonly size: number) {
    this.seq = new Array<number>(size).fill(0);
  }

  arrive(rank: number, call: Call): Promise<void> {
    if (this.failed) return Promise.reject(this.failed);
    const k = this.seq[rank]!++;
    let p = this.pending.get(k);
    if (!p) this.pending.set(k, (p = { calls: new Array(this.size).fill(undefined), waiters: [] }));
    p.calls[rank] = call;
    const done = new Promise<void>((resolve, reject) => p.waiters.push({ resolve, reject }));
    if (p.waiters.length === this.size) {
      this.pending.delete(k);
      try {
        run(p.calls as Call[], k);
        for (const w of p.waiters) w.resolve();
      } catch (err) {
        for (const w of p.waiters) w.reject(err);
      }
    }
    return done;
  }

  abort(rank: number, reason: unknown): void {
    if (this.failed) return;
    this.failed = reason instanceof RankFailed ? reason : new RankFailed(rank, reason);
    for (const p of this.pending.values()) for (const w of p.waiters) w.reject(this.failed);
    this.pending.clear();
  }
}

function mismatch(k: number, what: string): never {
  throw new RlstreamError('INPUT_INVALID', `collective #${k}: ${what}`);
}

function read(b: CollectiveBuffer, i: number): number {
  return b instanceof Float32Array ? b[i]! : fromBf16Bits(b[i]!);
}

function write(b: CollectiveBuffer, i: number, x: number): void {
  if (b instanceof Float32Array) b[i] = x;
  else b[i] = toBf16Bits(x);
}

/** Sums element i of every rank's buffer in rank order, in fp32. */
function sumAt(bufs: CollectiveBuffer[], i: number): number {
  let acc = 0;
  for (const b of bufs) acc = Math.fround(acc + read(b, i));
  return acc;
}

function run(calls: Call[], k: number): void {
  const op = calls[0]!.op;
  calls.forEach((c, r) => {
    if (c.op !== op) mismatch(k, `rank 0 called ${op} and rank ${r} called ${c.op}`);
  });
  const n = calls.length;
  if (op === 'allReduce') {
    const all = calls as Extract<Call, { op: 'allReduce' }>[];
    const count = all[0]!.buckets.length;
    all.forEach((c, r) => c.buckets.length !== count && mismatch(k, `allReduce: rank 0 passed ${count} bucket(s) and rank ${r} ${c.buckets.length}`));
    for (let b = 0; b < count; b++) {
      const bufs = all.map((c) => c.buckets[b]!);
      bufs.forEach((x, r) => (x.length !== bufs[0]!.length || dtypeOf(x) !== dtypeOf(bufs[0]!)) && mismatch(k, `allReduce bucket ${b}: rank 0 has ${bufs[0]!.length} ${dtypeOf(bufs[0]!)} and rank ${r} ${x.length} ${dtypeOf(x)}`));
      const out = new Float32Array(bufs[0]!.length);
      for (let i = 0; i < out.length; i++) out[i] = sumAt(bufs, i);
      for (const x of bufs) for (let i = 0; i < out.length; i++) write(x, i, out[i]!);
    }
  } else if (op === 'reduceScatter') {
    const all = calls as Extract<Call, { op: 'reduceScatter' }>[];
    const len = all[0]!.recv.length;
    all.forEach((c, r) => {
      checkSameDtype('reduceScatter', c.send, c.recv);
      if (c.recv.length !== len || c.send.length !== len * n) mismatch(k, `reduceScatter: rank ${r} has send ${c.send.length} and recv ${c.recv.length}; every rank needs recv ${len} and send ${len} x ${n} ranks`);
    });
    const sends = all.map((c) => c.send);
    all.forEach((c, r) => {
      for (let i = 0; i < len; i++) write(c.recv, i, sumAt(sends, r * len + i));
    });
  } else if (op === 'allGather') {
    const all = calls as Extract<Call, { op: 'allGather' }>[];
    const len = all[0]!.send.length;
    all.forEach((c, r) => {
      checkSameDtype('allGather', c.send, c.recv);
      if (c.send.length !== len || c.recv.length !== len * n) mismatch(k, `allGather: rank ${r} has send ${c.send.length} and recv ${c.recv.length}; every rank needs send ${len} and recv ${len} x ${n} ranks`);
    });
    const sends = all.map((c) => c.send.slice());
    for (const c of all) sends.forEach((s, r) => (c.recv as Float32Array).set(s as Float32Array, r * len));
  } else {
    const all = calls as Extract<Call, { op: 'broadcast' }>[];
    const root = all[0]!.root;
    all.forEach((c, r) => {
      if (c.root !== root) mismatch(k, `broadcast: rank 0 named root ${root} and rank ${r} root ${c.root}`);
      if (c.buf.length !== all[0]!.buf.length || dtypeOf(c.buf) !== dtypeOf(all[0]!.buf)) mismatch(k, `broadcast: rank ${r}'s buffer (${c.buf.length} ${dtypeOf(c.buf)}) differs from rank 0's (${all[0]!.buf.length} ${dtypeOf(all[0]!.buf)})`);
    });
    if (root < 0 || root >= n || !Number.isInteger(root)) mismatch(k, `broadcast: root ${root} is not a rank of ${n}`);
    const src = all[root]!.buf.slice();
    for (const c of all) (c.buf as Float32Array).set(src as Float32Array);
  }
}

class ReferenceRank extends HostCollective {
  readonly kind = 'reference';
  constructor(
    private readonly group: Group,
    readonly rank: number,
  ) {
    super();
  }
  get size(): number {
    return this.group.size;
  }
  allReduce(buckets: readonly CollectiveBuffer[]): Promise<void> {
    return this.group.arrive(this.rank, { op: 'allReduce', buckets });
  }
  reduceScatter(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void> {
    return this.group.arrive(this.rank, { op: 'reduceScatter', send, recv });
  }
  allGather(send: CollectiveBuffer, recv: CollectiveBuffer): Promise<void> {
    return this.group.arrive(this.rank, { op: 'allGather', send, recv });
  }
  broadcast(buf: CollectiveBuffer, root: number): Promise<void> {
    return this.group.arrive(this.rank, { op: 'broadcast', buf, root });
  }
  abort(reason: unknown): void {
    this.group.abort(this.rank, reason);
  }
  async close(): Promise<void> {
    this.group.abort(this.rank, new Error(`rank ${this.rank} closed its collective`));
  }
}

/** N ranks of one in-process group: ranks[r] is rank r's Collective. */
export function referenceGroup(size: number): Collective[] {
  if (!Number.isInteger(size) || size < 1) throw new RlstreamError('INPUT_INVALID', `a collective group needs an integer size >= 1, got ${size}`);
  const g = new Group(size);
  return Array.from({ length: size }, (_, r) => new ReferenceRank(g, r));
}
