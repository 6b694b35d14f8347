// The trainer never trains a trajectory twice: records of trajectories its committed steps took, published again
// (as a repaired log or a producer that sends twice does), are skipped and counted, in the same life and after a
// restart; with the checkpoint's consumed set deleted, the log's TrainSteps alone still hold; the set forgets ids
// below the staleness horizon and nothing else.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { ConsumedTrajectories } from '../../consumers/trainer/consumed.ts';
import type { TrainStep } from '../../schemas/generated/types.ts';
import { tempDir } from '../../testkit/events.ts';
import { advantagedRecords, syntheticGroup, tinyTrainer, trainerInputs, trainerLife } from './fixtures/synthetic.ts';

const RUN = 'consumed-test';
const SIZE = 2;

const skippedMetric = (s: TrainStep) => s.metrics.find((m) => m.name === 'skipped_already_consumed')?.value;

/** Groups as the advantage consumer writes them; `version` (default 0) is the policy version they were generated at. */
async function publish(log: EventLog, serde: EventSerde, groups: number[], version: Record<number, number> = {}): Promise<void> {
  const p = await log.producer();
  for (const g of groups) await p.send(TOPICS.advantaged, advantagedRecords(serde, syntheticGroup(RUN, g, SIZE, version[g] ?? 0)));
  await p.close();
}

/** One life of a trainer on the log: it trains `steps` more steps (one group each), then closes. */
function life(log: EventLog, serde: EventSerde, dir: string, weights: string, steps: number, bound = 4): Promise<{ seen: TrainStep[]; alreadyConsumed: number }> {
  return trainerLife({ log, serde, runId: RUN, dataDir: join(dir, 'data'), weights }, steps, bound);
}

test('records of trajectories already trained, published again, are skipped and counted: in the same life, after a restart, and with the checkpoint set deleted', { timeout: 120_000 }, async () => {
  const { dir, logDir, weights } = await trainerInputs('consumed', RUN, [{ g: 0 }, { g: 1 }], SIZE, 1);
  const log = openEmbeddedLog({ dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    // Life 1: groups 0 and 1 trained; then both come again before group 2, in one life.
    const first = await (async () => {
      const seen: TrainStep[] = [];
      const trainer = tinyTrainer({ log, serde, runId: RUN, dataDir: join(dir, 'data'), weights }, { max_steps: 3, threads: 1, groups_per_step: 1, staleness_bound: 4 }, { followControl: false, onStep: (s) => seen.push(s) });
      await trainer.start();
      const running = trainer.run();
      while (seen.length < 2) await new Promise((r) => setTimeout(r, 50));
      await publish(log, serde, [0, 1, 2]);
      await running;
      await trainer.close();
      return { seen, alreadyConsumed: trainer.counters.alreadyConsumed };
    })();
    assert.deepEqual(first.seen.map((s) => s.trajectories), [SIZE, SIZE, SIZE]);
    assert.equal(first.alreadyConsumed, 2 * SIZE, 'both groups skipped when they came again');
    assert.equal(skippedMetric(first.seen[2]!), 2 * SIZE, 'the step that skipped them counts them');
    assert.equal(skippedMetric(first.seen[0]!), 0);
    // Life 2, restarted from the checkpoint: everything so far comes again, then group 3.
    await publish(log, serde, [0, 1, 2, 3]);
    const second = await life(log, serde, dir, weights, 1);
    assert.equal(second.alreadyConsumed, 3 * SIZE);
    assert.equal(skippedMetric(second.seen[0]!), 3 * SIZE);
    // Life 3, with the checkpoint's set deleted (the second layer, the log's TrainSteps, holds) and a damaged one
    // in an older checkpoint that is not read. The bound is now 2 at version 4: groups 0 and 1 (steps at versions 0
    // and 1) are below the horizon, and group 0 comes generated again under the same ids at version 4, where the
    // staleness check lets it through; the older tier (fingerprints) catches it.
    rmSync(join(dir, 'data', 'trainer', 'step-4', 'consumed.json'));
    writeFileSync(join(dir, 'data', 'trainer', 'step-3', 'consumed.json'), '{"horizon":');
    await publish(log, serde, [0, 1, 2, 3, 4], { 0: 4, 4: 4 });
    const third = await life(log, serde, dir, weights, 1, 2);
    assert.equal(third.alreadyConsumed, 4 * SIZE);
    const all = [...first.seen, ...second.seen, ...third.seen];
    const ids = all.flatMap((s) => s.trajectory_ids);
    assert.equal(ids.length, 5 * SIZE, 'five groups trained');
    assert.equal(new Set(ids).size, ids.length, 'no trajectory trained twice');
    assert.deepEqual(all.map((s) => s.step), [1, 2, 3, 4, 5]);
    const committed = await log.committed(`${RUN}.trainer`, TOPICS.advantaged);
    assert.equal(committed[0]!.offset, (2 + 3 + 4 + 5) * SIZE, 'every record consumed, skipped ones included');
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a damaged consumed set in the checkpoint the trainer resumes from is reported and the log rebuilds it', { timeout: 60_000 }, async () => {
  const { dir, logDir, weights } = await trainerInputs('consumed-bad', RUN, [{ g: 0 }], SIZE, 1);
  const log = openEmbeddedLog({ dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    await life(log, serde, dir, weights, 1);
    writeFileSync(join(dir, 'data', 'trainer', 'step-1', 'consumed.json'), 'not json');
    await publish(log, serde, [0, 1]);
    const next = await life(log, serde, dir, weights, 1);
    assert.equal(next.alreadyConsumed, SIZE);
    assert.equal(new Set([...next.seen[0]!.trajectory_ids]).size, SIZE);
    const loaded = await ConsumedTrajectories.load(join(dir, 'data', 'trainer', 'step-2'));
    assert.equal(loaded.problem, null);
    assert.equal(loaded.set!.size.exact, 2 * SIZE, 'the new checkpoint holds both groups again');
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the consumed set keeps every id still trainable under the staleness bound exactly, the older ones as fingerprints; its horizon only rises', async () => {
  const set = ConsumedTrajectories.empty();
  set.add([['a', 0], ['b', 1]], 1, 2);
  assert.ok(set.has('a') && set.has('b'));
  set.add([['c', 3]], 3, 2);
  // Version 3, bound 2: a sample of version 1 may still train, one of version 0 only as a copy generated again.
  assert.equal(set.horizon, 1);
  assert.deepEqual(set.size, { exact: 2, older: 1 });
  assert.ok(set.has('a'), 'below the horizon: still known, by fingerprint');
  assert.ok(!set.has('d'));
  assert.ok(set.has('b') && set.has('c'));
  assert.ok(set.belowHorizon(0) && !set.belowHorizon(1));
  // A raised bound does not lower the horizon: whether version-0 samples were trained can no longer be told.
  set.add([], 3, 5);
  assert.equal(set.horizon, 1);
  const dir = tempDir('consumed-set');
  await set.save(dir);
  const back = await ConsumedTrajectories.load(dir);
  assert.equal(back.problem, null);
  // The checkpoint holds the exact tier; the older one comes back from the log's TrainSteps.
  assert.deepEqual([back.set!.horizon, back.set!.has('b'), back.set!.has('c'), back.set!.has('a')], [1, true, true, false]);
  assert.deepEqual(await ConsumedTrajectories.load(join(dir, 'none')), { set: null, problem: null });
  writeFileSync(join(dir, 'consumed.json'), '{"horizon": 1, "ids": [["x"]]}');
  assert.match((await ConsumedTrajectories.load(dir)).problem ?? '', /consumed\.json is not \{"horizon"/);
});
