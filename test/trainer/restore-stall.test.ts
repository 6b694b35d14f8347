// A restart never resumes from a partial read of the log. CI once saw a trainer, restarted after a broker outage,
// resume a step behind the log and train step 4 (and its samples) twice, on both Kafka clients; the restore then took
// a read that had stopped moving for 15 s as the end. Here the read is made unable to reach its end (train.steps or
// policy.versions listed past what the log holds, by a generated amount: a record the consumer cannot get to):
// start() must fail retriably and publish nothing, and the same trainer started on the truthful log resumes after
// the last committed step and trains on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { isRlstreamError } from '../../core/errors.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { rng } from '../../core/random.ts';
import type { PolicyVersion, TrainStep } from '../../schemas/generated/types.ts';
import { advantagedRecords, readAll, syntheticGroup, tinyTrainer, trainerInputs, trainerLife } from './fixtures/synthetic.ts';
import { listingPastTheEnd } from '../../testkit/log-views.ts';

const RUN = 'restore-stall';
const SIZE = 2;

function trainSteps(log: EventLog, serde: EventSerde, dataDir: string, weights: string, steps: number): Promise<TrainStep[]> {
  return trainerLife({ log, serde, runId: RUN, dataDir, weights }, steps, 8).then((l) => l.seen);
}

test('a trainer whose restore cannot read to the end fails retriably and publishes nothing; on the whole log it resumes after the last step', { timeout: 180_000 }, async () => {
  const { dir, logDir, weights } = await trainerInputs('restore-stall', RUN, [{ g: 0 }, { g: 1 }], SIZE, 1);
  const log = openEmbeddedLog({ dir: logDir });
  const dataDir = join(dir, 'data');
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const first = await trainSteps(log, serde, dataDir, weights, 2);
    assert.deepEqual(first.map((s) => s.step), [1, 2]);

    // Generated stalls: either topic of the restore, 1-5 records short. Each start fails with a retriable
    // LOG_UNAVAILABLE naming the restore, and nothing is written to either topic.
    const rand = rng(50);
    const cases = [...Array.from({ length: 4 }, () => ({ topic: rand() < 0.5 ? TOPICS.trainSteps : TOPICS.policyVersions, extra: 1 + Math.floor(rand() * 5) })), { topic: TOPICS.trainSteps, extra: 1 }, { topic: TOPICS.policyVersions, extra: 1 }];
    for (const c of cases) {
      const before = [(await log.offsets(TOPICS.trainSteps))[0]!.high, (await log.offsets(TOPICS.policyVersions))[0]!.high];
      const stalled = listingPastTheEnd(log, c.topic, c.extra);
      const trainer = tinyTrainer({ log: stalled, serde, runId: RUN, dataDir, weights }, { max_steps: 0, threads: 1, groups_per_step: 1, staleness_bound: 8 }, { followControl: false, restoreTimeoutMs: 1500 });
      await assert.rejects(trainer.start(), (e: unknown) => isRlstreamError(e) && e.code === 'LOG_UNAVAILABLE' && e.retriable === true && /trainer restore/.test(e.message), `${c.topic} listed ${c.extra} past its end`);
      await trainer.close();
      const after = [(await log.offsets(TOPICS.trainSteps))[0]!.high, (await log.offsets(TOPICS.policyVersions))[0]!.high];
      assert.deepEqual(after, before, `${c.topic} listed ${c.extra} past its end: nothing published`);
    }

    // On the whole log the trainer resumes after step 2 and trains on: steps and versions stay once each.
    const p = await log.producer();
    for (const g of [2, 3]) await p.send(TOPICS.advantaged, advantagedRecords(serde, syntheticGroup(RUN, g, SIZE, 0)));
    await p.close();
    const second = await trainSteps(log, serde, dataDir, weights, 2);
    assert.deepEqual(second.map((s) => s.step), [3, 4]);
    const steps = (await readAll<TrainStep>(log, serde, TOPICS.trainSteps, 'TrainStep')).map((s) => s.step);
    assert.deepEqual(steps, [1, 2, 3, 4]);
    const versions = (await readAll<PolicyVersion>(log, serde, TOPICS.policyVersions, 'PolicyVersion')).map((v) => v.policy_version);
    assert.deepEqual(versions, [...new Set(versions)].sort((a, b) => a - b), 'versions once each, in order');
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
