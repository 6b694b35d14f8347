// The reference collective (N ranks in one process) and gradient buckets against single-process arithmetic:
// bucketed fp32 all-reduce equals the rank-order fp32 sum bit for bit, whatever the bucket size (odd ones
// included); bf16 equals the bf16-rounded sum of bf16-rounded inputs bit for bit and the exact sum within bf16's
// precision; and a rank that fails releases every other rank. ZeRO-1 (the native model's sharded AdamW) is
// zero1.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rng } from '../../../core/random.ts';
import { fromBf16, fromBf16Bits, toBf16, toBf16Bits } from '../../../native/collectives/bf16.ts';
import { allReduceGradients, planBuckets } from '../../../consumers/trainer/parallel/buckets.ts';
import { RankFailed } from '../../../native/collectives/collective.ts';
import { FlatLayout } from '../../../consumers/trainer/parallel/flat.ts';
import { referenceGroup } from '../../../native/collectives/reference-collective.ts';

const RANKS = [1, 2, 3, 4];

function randomTensors(r: () => number, lengths: number[], scale = 1): Float32Array[] {
  return lengths.map((n) => Float32Array.from({ length: n }, () => (r() * 2 - 1) * scale * (r() < 0.1 ? 1e-4 : 1)));
}

// Tensor lengths of odd sizes, a length-1 tensor and an empty one among them.
const LENGTHS = [37, 1, 250, 0, 129, 64];
const NUMEL = LENGTHS.reduce((a, b) => a + b, 0);

test('bf16 conversion rounds to nearest even and keeps NaN, infinities and signed zero', () => {
  assert.equal(toBf16Bits(1), 0x3f80);
  assert.equal(fromBf16Bits(toBf16Bits(1 + 2 ** -8)), 1, 'a tie rounds to the even neighbour (down)');
  assert.equal(fromBf16Bits(toBf16Bits(1 + 3 * 2 ** -8)), 1 + 2 ** -6, 'a tie rounds to the even neighbour (up)');
  assert.equal(fromBf16Bits(toBf16Bits(1 + 2 ** -8 + 2 ** -20)), 1 + 2 ** -7, 'above the tie rounds up');
  assert.ok(Number.isNaN(fromBf16Bits(toBf16Bits(Number.NaN))));
  assert.equal(fromBf16Bits(toBf16Bits(Number.POSITIVE_INFINITY)), Number.POSITIVE_INFINITY);
  assert.ok(Object.is(fromBf16Bits(toBf16Bits(-0)), -0));
  assert.equal(fromBf16Bits(toBf16Bits(3.4e38)), Number.POSITIVE_INFINITY, 'past bf16\'s largest finite value');
  const r = rng(1);
  const x = Float32Array.from({ length: 10000 }, () => (r() - 0.5) * 10 ** Math.floor(r() * 10 - 5));
  const y = fromBf16(toBf16(x));
  for (let i = 0; i < x.length; i++) assert.ok(Math.abs(y[i]! - x[i]!) <= Math.abs(x[i]!) * 2 ** -8, `${x[i]} -> ${y[i]}`);
});

test('bucket plans cover the vector once, last range first, in buckets of at most the given bytes', () => {
  for (const [bytes, dtype, per] of [[4, 'fp32', 1], [28, 'fp32', 7], [30, 'fp32', 7], [6, 'bf16', 3], [4096, 'bf16', 2048]] as const) {
    const plan = planBuckets(NUMEL, bytes, dtype);
    assert.equal(plan.ranges[0]![1], NUMEL);
    for (let b = 0; b < plan.ranges.length; b++) {
      const [s, e] = plan.ranges[b]!;
      assert.ok(e - s >= 1 && e - s <= per, `bucket ${b} holds ${e - s} elements; at most ${per}`);
      if (b > 0) assert.equal(e, plan.ranges[b - 1]![0]);
    }
    assert.equal(plan.ranges.at(-1)![0], 0);
  }
  assert.throws(() => planBuckets(10, 3, 'fp32'), /bucket size 3 bytes holds no fp32 element \(4 bytes\)/);
  assert.throws(() => planBuckets(10, 1, 'bf16'), /holds no bf16 element/);
});

test('bucketed fp32 all-reduce over N ranks equals the rank-order sum bit for bit, for odd bucket sizes', async () => {
  const r = rng(7);
  for (const n of RANKS) {
    for (const bytes of [4, 28, 4 * 97, 4 * NUMEL, 1 << 20]) {
      const grads = Array.from({ length: n }, () => randomTensors(r, LENGTHS));
      const want = LENGTHS.map((len, t) => Float32Array.from({ length: len }, (_, i) => grads.reduce((acc, g) => Math.fround(acc + g[t]![i]!), 0)));
      const group = referenceGroup(n);
      const layout = new FlatLayout(LENGTHS);
      await Promise.all(group.map((c, k) => allReduceGradients(c, layout, grads[k]!, planBuckets(NUMEL, bytes, 'fp32'))));
      for (let k = 0; k < n; k++) assert.deepEqual(grads[k], want, `rank ${k} of ${n}, buckets of ${bytes} bytes`);
    }
  }
});

test('bucketed bf16 all-reduce: the bf16-rounded sum of bf16 inputs, within bf16 precision of the exact sum', async () => {
  const r = rng(8);
  for (const n of RANKS) {
    for (const bytes of [2, 14, 2 * 101]) {
      const grads = Array.from({ length: n }, () => randomTensors(r, LENGTHS));
      const exact = LENGTHS.map((len, t) => Array.from({ length: len }, (_, i) => grads.reduce((acc, g) => acc + g[t]![i]!, 0)));
      const want = LENGTHS.map((len, t) =>
        Float32Array.from({ length: len }, (_, i) => fromBf16Bits(toBf16Bits(grads.reduce((acc, g) => Math.fround(acc + fromBf16Bits(toBf16Bits(g[t]![i]!))), 0)))),
      );
      const absMax = LENGTHS.map((_, t) => grads.map((g) => g[t]!).reduce((m, x) => Math.max(m, ...[...x].map(Math.abs)), 0));
      const group = referenceGroup(n);
      const layout = new FlatLayout(LENGTHS);
      await Promise.all(group.map((c, k) => allReduceGradients(c, layout, grads[k]!, planBuckets(NUMEL, bytes, 'bf16'))));
      for (let k = 0; k < n; k++) {
        assert.deepEqual(grads[k], want, `rank ${k} of ${n}, buckets of ${bytes} bytes`);
        // each input rounded once (2^-9 relative) and the sum once more: within (n + 1) × 2^-8 of the largest input
        grads[k]!.forEach((t, ti) => t.forEach((x, i) => assert.ok(Math.abs(x - exact[ti]![i]!) <= (n + 1) * 2 ** -8 * absMax[ti]!, `${x} vs ${exact[ti]![i]}`)));
      }
    }
  }
});

test('reduceScatter, allGather and broadcast give every rank what one process computes', async () => {
  const r = rng(9);
  for (const n of RANKS) {
    const len = 5;
    const sends = Array.from({ length: n }, () => randomTensors(r, [len * n])[0]!);
    const recvs = Array.from({ length: n }, () => new Float32Array(len));
    const group = referenceGroup(n);
    await Promise.all(group.map((c, k) => c.reduceScatter(sends[k]!, recvs[k]!)));
    recvs.forEach((got, k) => assert.deepEqual(got, Float32Array.from({ length: len }, (_, i) => sends.reduce((a, s) => Math.fround(a + s[k * len + i]!), 0))));
    const gathered = Array.from({ length: n }, () => new Float32Array(len * n));
    await Promise.all(group.map((c, k) => c.allGather(recvs[k]!, gathered[k]!)));
    for (const g of gathered) assert.deepEqual(g, Float32Array.from(recvs.flatMap((x) => [...x])));
    const bufs = Array.from({ length: n }, (_, k) => Uint16Array.of(k, k + 1, k + 2));
    await Promise.all(group.map((c, k) => c.broadcast(bufs[k]!, n - 1)));
    for (const b of bufs) assert.deepEqual(b, Uint16Array.of(n - 1, n, n + 1));
  }
});

test('a rank that fails releases every other rank: pending and later collectives reject with RankFailed naming it', async () => {
  const group = referenceGroup(3);
  const pending = [group[0]!.allReduce([new Float32Array(4)]), group[2]!.allReduce([new Float32Array(4)])];
  group[1]!.abort(new Error('CUDA error: an illegal memory access'));
  for (const p of pending) await assert.rejects(p, (e: unknown) => e instanceof RankFailed && e.failedRank === 1 && /rank 1 failed: CUDA error: an illegal memory access/.test(e.message));
  await assert.rejects(group[0]!.broadcast(new Float32Array(1), 0), RankFailed);
});

test('ranks that disagree on the operation or the buffers get an error naming both, not a hang', async () => {
  let group = referenceGroup(2);
  let both = await Promise.allSettled([group[0]!.allReduce([new Float32Array(3)]), group[1]!.allGather(new Float32Array(3), new Float32Array(6))]);
  for (const s of both) assert.match(String((s as PromiseRejectedResult).reason), /collective #0: rank 0 called allReduce and rank 1 called allGather/);
  group = referenceGroup(2);
  both = await Promise.allSettled([group[0]!.allReduce([new Float32Array(3)]), group[1]!.allReduce([new Float32Array(4)])]);
  for (const s of both) assert.match(String((s as PromiseRejectedResult).reason), /allReduce bucket 0: rank 0 has 3 fp32 and rank 1 4 fp32/);
  group = referenceGroup(2);
  both = await Promise.allSettled([group[0]!.allGather(new Float32Array(3), new Float32Array(5)), group[1]!.allGather(new Float32Array(3), new Float32Array(6))]);
  for (const s of both) assert.match(String((s as PromiseRejectedResult).reason), /allGather: rank 0 has send 3 and recv 5/);
  assert.throws(() => referenceGroup(0), /integer size >= 1/);
});
