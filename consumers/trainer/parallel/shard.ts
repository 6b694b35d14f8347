// Sharding one step's trajectories across the data-parallel ranks: by group (a group's advantages were estimated
// over the whole group, so its members train on one rank and the group is never split), balanced by tokens (a
// rank's compute follows its tokens, not its trajectory count). The assignment depends only on the step's groups,
// never on their arrival order: groups sorted by tokens (largest first, then by id), each given to the rank with
// the fewest tokens so far (lowest rank on a tie), the longest-processing-time rule. Its bound, which the tests
// assert: the most- and least-loaded ranks differ by at most the largest group's tokens (each group goes to the
// least-loaded rank, so the gap it can open is its own size).
import { RlstreamError } from '../../../core/errors.ts';

export interface StepGroup<S> {
  groupId: string;
  /** The group's members on this step (trained samples only; the dropped never reach a rank). */
  samples: S[];
  /** Tokens the group costs a rank (prompt + response of every member). */
  tokens: number;
}

/**
 * What a step with fewer groups than ranks does: 'refuse' throws (the run's groups_per_step is below its rank
 * count, a configuration to fix), 'idle' lets the ranks without a group contribute zero gradients to the step
 * (the step's result is unchanged: every rank scales its loss by the step's global token count).
 */
export type FewerGroups = 'refuse' | 'idle';

export interface StepShards<S> {
  /** shards[r]: the groups of rank r, in the order rank r trains them (largest first). */
  shards: StepGroup<S>[][];
  /** tokens[r]: the tokens of rank r's groups. */
  tokens: number[];
  /** Ranks with no group this step (only with fewerGroups 'idle'). */
  idle: number[];
}

export function shardStep<S>(groups: readonly StepGroup<S>[], ranks: number, fewerGroups: FewerGroups = 'refuse'): StepShards<S> {
  if (!Number.isInteger(ranks) || ranks < 1) throw new RlstreamError('INPUT_INVALID', `ranks must be an integer >= 1, got ${ranks}`);
  const seen = new Set<string>();
  for (const g of groups) {
    if (seen.has(g.groupId)) throw new RlstreamError('INPUT_INVALID', `group ${g.groupId} appears twice in the step: a group is sharded whole, once`);
    seen.add(g.groupId);
    if (!Number.isSafeInteger(g.tokens) || g.tokens < 0) throw new RlstreamError('INPUT_INVALID', `group ${g.groupId} has tokens ${g.tokens}; a count >= 0 is needed`);
  }
  if (groups.length < ranks && fewerGroups === 'refuse') {
    throw new RlstreamError(
      'INPUT_INVALID',
      `the step has ${groups.length} group(s) for ${ranks} ranks: a group is never split, so ${ranks - groups.length} rank(s) would have nothing to train; raise trainer.groups_per_step to at least ${ranks}, or let ranks idle`,
    );
  }
  const order = [...groups].sort((a, b) => b.tokens - a.tokens || (a.groupId < b.groupId ? -1 : a.groupId > b.groupId ? 1 : 0));
  const shards: StepGroup<S>[][] = Array.from({ length: ranks }, () => []);
  const tokens = new Array<number>(ranks).fill(0);
  for (const g of order) {
    let r = 0;
    for (let k = 1; k < ranks; k++) if (tokens[k]! < tokens[r]!) r = k;
    shards[r]!.push(g);
    tokens[r]! += g.tokens;
  }
  const idle = shards.flatMap((s, r) => (s.length === 0 ? [r] : []));
  return { shards, tokens, idle };
}

/** A step's samples grouped by group id, in first-seen order; `tokens` of a sample is what it costs a rank. */
export function groupsOf<S>(items: readonly { groupId: string; sample: S }[], tokens: (s: S) => number): StepGroup<S>[] {
  const byId = new Map<string, StepGroup<S>>();
  for (const { groupId, sample } of items) {
    let g = byId.get(groupId);
    if (!g) byId.set(groupId, (g = { groupId, samples: [], tokens: 0 }));
    g.samples.push(sample);
    g.tokens += tokens(sample);
  }
  return [...byId.values()];
}
