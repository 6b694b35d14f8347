// Sharding a step's groups across data-parallel ranks (consumers/trainer/parallel/shard.ts): over generated group
// sets (uneven and heavy-tailed sizes, empty groups, fewer groups than ranks) and hand-written ones, every group
// lands on exactly one rank and whole, the ranks' token loads differ by at most the largest group, and the
// assignment depends on the groups alone, not on their order.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rng, shuffle } from '../../../core/random.ts';
import { isRlstreamError } from '../../../core/errors.ts';
import { groupsOf, shardStep, type StepGroup, type StepShards } from '../../../consumers/trainer/parallel/shard.ts';

type Sample = { id: string; tokens: number };

function group(id: string, sizes: number[]): StepGroup<Sample> {
  const samples = sizes.map((t, k) => ({ id: `${id}/${k}`, tokens: t }));
  return { groupId: id, samples, tokens: sizes.reduce((a, b) => a + b, 0) };
}

/** The invariants every sharding must keep; returns the spread (max - min load). */
function checkShards(groups: StepGroup<Sample>[], ranks: number, s: StepShards<Sample>): number {
  assert.equal(s.shards.length, ranks);
  const where = new Map<string, number>();
  s.shards.forEach((shard, r) => {
    for (const g of shard) {
      assert.ok(!where.has(g.groupId), `group ${g.groupId} on ranks ${where.get(g.groupId)} and ${r}`);
      where.set(g.groupId, r);
    }
    assert.equal(s.tokens[r], shard.reduce((n, g) => n + g.tokens, 0), `rank ${r}'s token count`);
  });
  // union = all, and each group whole: the same samples, none moved between groups
  assert.deepEqual([...where.keys()].sort(), groups.map((g) => g.groupId).sort());
  const byId = new Map(groups.map((g) => [g.groupId, g]));
  for (const g of s.shards.flat()) assert.deepEqual(g.samples, byId.get(g.groupId)!.samples);
  const samples = s.shards.flat().flatMap((g) => g.samples.map((x) => x.id));
  assert.equal(new Set(samples).size, samples.length, 'no sample on two ranks');
  assert.equal(samples.length, groups.reduce((n, g) => n + g.samples.length, 0), 'every sample on a rank');
  const maxGroup = Math.max(0, ...groups.map((g) => g.tokens));
  const spread = Math.max(...s.tokens) - Math.min(...s.tokens);
  assert.ok(spread <= maxGroup, `loads ${s.tokens.join(',')} differ by ${spread} > the largest group ${maxGroup}`);
  const total = groups.reduce((n, g) => n + g.tokens, 0);
  assert.ok(Math.max(...s.tokens) <= total / ranks + maxGroup, 'the busiest rank holds at most its even share plus one group');
  assert.deepEqual(s.idle, s.shards.flatMap((x, r) => (x.length === 0 ? [r] : [])));
  return spread;
}

const assignment = (s: StepShards<Sample>) => s.shards.map((x) => x.map((g) => g.groupId));

test('generated group sets: union = all, disjoint, whole groups, balance within the largest group, order-independent', () => {
  const r = rng(53);
  let cases = 0;
  let fewer = 0;
  for (let c = 0; c < 2000; c++) {
    const ranks = 1 + Math.floor(r() * 9);
    const n = Math.floor(r() * 40);
    const groups = Array.from({ length: n }, (_, g) => {
      const size = 1 + Math.floor(r() * 16);
      // heavy-tailed lengths (a few trajectories hit the token limit), and sometimes empty ones
      const sizes = Array.from({ length: size }, () => (r() < 0.05 ? 0 : r() < 0.1 ? 2000 + Math.floor(r() * 6000) : 20 + Math.floor(r() * 400)));
      return group(`g${c}-${g}`, sizes);
    });
    if (n < ranks) {
      fewer++;
      assert.throws(() => shardStep(groups, ranks, 'refuse'), (e: unknown) => isRlstreamError(e, 'INPUT_INVALID') && e.message.includes(`${n} group(s) for ${ranks} ranks`));
    }
    const s = shardStep(groups, ranks, 'idle');
    checkShards(groups, ranks, s);
    if (n >= ranks) assert.deepEqual(s.idle.filter((k) => s.shards[k]!.length > 0), []);
    assert.ok(s.idle.length >= Math.max(0, ranks - n), 'ranks without a group are listed idle');
    // the same groups in another order: the same assignment
    assert.deepEqual(assignment(shardStep(shuffle([...groups], r), ranks, 'idle')), assignment(s));
    cases++;
  }
  assert.equal(cases, 2000);
  assert.ok(fewer > 50, `the generator made ${fewer} cases with fewer groups than ranks`);
});

test('hand-written: one giant group, equal groups, ties, a single rank', () => {
  // one group larger than all the others together: it alone on a rank, the rest spread over the others
  const giant = [group('big', [5000, 5000]), ...Array.from({ length: 9 }, (_, i) => group(`s${i}`, [100, 100]))];
  const s = shardStep(giant, 3);
  checkShards(giant, 3, s);
  assert.deepEqual(s.shards[0]!.map((g) => g.groupId), ['big']);
  assert.deepEqual(s.tokens, [10000, 1000, 800]);
  // equal groups: counts differ by at most one, and ties go to the lowest rank, by group id
  const equal = Array.from({ length: 10 }, (_, i) => group(`e${i}`, [64, 64]));
  const e = shardStep(equal, 4);
  checkShards(equal, 4, e);
  assert.deepEqual(assignment(e), [['e0', 'e4', 'e8'], ['e1', 'e5', 'e9'], ['e2', 'e6'], ['e3', 'e7']]);
  // one rank takes everything, largest first
  const one = shardStep(equal.slice(0, 3), 1);
  assert.deepEqual(assignment(one), [['e0', 'e1', 'e2']]);
  // groups of zero tokens (every member masked out) still land somewhere, once
  const zeros = [group('z0', [0]), group('z1', [0]), group('z2', [0, 0])];
  checkShards(zeros, 2, shardStep(zeros, 2));
});

test('fewer groups than ranks: refused with the counts and the fix, or the extra ranks listed idle', () => {
  const two = [group('a', [10]), group('b', [30])];
  assert.throws(() => shardStep(two, 4), /the step has 2 group\(s\) for 4 ranks: a group is never split, so 2 rank\(s\) would have nothing to train; raise trainer.groups_per_step to at least 4/);
  const s = shardStep(two, 4, 'idle');
  assert.deepEqual(assignment(s), [['b'], ['a'], [], []]);
  assert.deepEqual(s.idle, [2, 3]);
  // an empty step (only stale samples) trains nowhere
  assert.deepEqual(shardStep([], 3, 'idle').idle, [0, 1, 2]);
  assert.throws(() => shardStep([], 1), /0 group\(s\) for 1 ranks/);
});

test('bad input is refused, naming it: a group twice, a token count that is not a count, a rank count below 1', () => {
  assert.throws(() => shardStep([group('a', [1]), group('a', [2])], 2), /group a appears twice/);
  for (const bad of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
    assert.throws(() => shardStep([{ groupId: 'x', samples: [], tokens: bad }], 1), new RegExp(`group x has tokens ${bad}`));
  }
  for (const ranks of [0, -2, 1.5, Number.NaN]) assert.throws(() => shardStep([group('a', [1])], ranks), /ranks must be an integer >= 1/);
});

test('groupsOf gathers a step\'s samples by group id, in first-seen order, with their tokens', () => {
  const items = [
    { groupId: 'g2', sample: { id: 't1', tokens: 5 } },
    { groupId: 'g1', sample: { id: 't2', tokens: 7 } },
    { groupId: 'g2', sample: { id: 't3', tokens: 11 } },
  ];
  const groups = groupsOf(items, (s) => s.tokens);
  assert.deepEqual(groups.map((g) => [g.groupId, g.tokens, g.samples.map((s) => s.id)]), [['g2', 16, ['t1', 't3']], ['g1', 7, ['t2']]]);
});
