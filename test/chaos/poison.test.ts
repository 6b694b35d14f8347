// Poison mid-run on the distributed shape (every role its own process on a private Kafka broker): corrupt
// bytes, an unknown schema id, a NaN reward (from the reward function, and written straight to `rewarded`)
// and an oversized record are injected while the run goes on. Each is dead-lettered with its reason, and the
// run completes: every started trajectory is consumed by the trainer exactly once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { EventSerde } from '../../core/serde/events.ts';
import { openRegistryFor } from '../../core/serde/open.ts';
import { TOPICS } from '../../core/topics.ts';
import type { RewardedTrajectory, TrajectoryCompleted } from '../../schemas/generated/types.ts';
import { service } from '../kafka/services.ts';
import { auditRun, clickhouse, collectRun, readTopic } from '../../testkit/audit.ts';
import { drainRun, withPrivateRun } from './scenario.ts';

const registry = service('SCHEMA_REGISTRY_URL', 'poison records mid-run');
const clickhouseUrl = registry ? service('CLICKHOUSE_URL', 'poison records mid-run') : null;
if (registry && clickhouseUrl) {
  test('corrupt bytes, unknown schema id, NaN rewards and an oversized record are dead-lettered; the run completes', { timeout: 150_000 }, async (t) => {
    const t0 = Date.now();
    await withPrivateRun(t, 'poison', { 'task.train_rows': 8, 'reward.module': join(import.meta.dirname, 'fixtures', 'nan-reward.ts'), 'reward.export': 'score' }, async (s) => {
      const { log, run, sup } = s;
      const serde = await new EventSerde(await openRegistryFor(log, { url: registry })).init();
      sup.start();
      // Templates: the run's first completed and rewarded trajectories, once they exist (mid-run).
      let completed: TrajectoryCompleted | undefined;
      let rewarded: RewardedTrajectory | undefined;
      const by = Date.now() + 60_000;
      while ((!completed || !rewarded) && Date.now() < by) {
        await readTopic(log, TOPICS.rolloutEvents, async (v) => {
          const ev = serde.tryDecodeSync(v);
          if (ev?.name === 'TrajectoryCompleted' && ev.value.trajectory.run_id === run.runId) completed ??= ev.value;
        });
        await readTopic(log, TOPICS.rewarded, async (v) => {
          const ev = serde.tryDecodeSync(v);
          if (ev?.name === 'RewardedTrajectory' && ev.value.trajectory.run_id === run.runId) rewarded ??= ev.value;
        });
        if (!completed || !rewarded) await sleep(500);
      }
      assert.ok(completed && rewarded, 'the run produced no rewarded trajectory within 60 s');
      const traj = (id: string, extra: Partial<TrajectoryCompleted['trajectory']>) => ({ ...completed!.trajectory, trajectory_id: id, group_id: `${id}-group`, group_size: 1, ...extra });
      const producer = await log.producer();
      await producer.send(TOPICS.rolloutEvents, [
        { key: 'poison-corrupt', value: Buffer.from('definitely not an Avro record') },
        { key: 'poison-schema', value: Buffer.from([0, 0x7f, 0xff, 0xff, 0x01, 2, 4, 6, 8]) },
        { key: 'poison-nan-group', value: serde.encode('TrajectoryCompleted', { event_id: 'poison-nan-completed', time_ms: Date.now(), trajectory: traj('poison-nan', { ground_truth: 'nan' }) }) },
        // Its reward would be over the processor's 1 MiB output limit.
        { key: 'poison-big-group', value: serde.encode('TrajectoryCompleted', { event_id: 'poison-big-completed', time_ms: Date.now(), trajectory: traj('poison-big', { response_text: 'x'.repeat(1_200_000) }) }) },
      ]);
      await producer.send(TOPICS.rewarded, [
        {
          key: 'poison-nan2-group',
          value: serde.encode('RewardedTrajectory', { ...rewarded!, event_id: 'poison-nan2-rewarded', trajectory: { ...rewarded!.trajectory, trajectory_id: 'poison-nan2', group_id: 'poison-nan2-group', group_size: 1, sample_index: 0 }, reward: { ...rewarded!.reward, score: Number.NaN } }),
        },
      ]);
      await producer.close();

      // The run completes: the dataset is done and every started trajectory is in a committed step.
      const { rolloutDone: done, started, consumed } = await drainRun(s, serde, 45_000);
      // The trace sink catches up on the dead letters.
      const sinkBy = Date.now() + 20_000;
      while (Date.now() < sinkBy && (await log.lag(`${run.runId}.traces`, TOPICS.deadLetter).catch(() => [{ lag: 1 }])).reduce((n, l) => n + l.lag, 0) > 0) await sleep(500);
      await sup.stopAll();

      const records = await collectRun(log, serde, run.runId);
      const audit = auditRun(records);
      const byKey = new Map<string, string>();
      for (const d of records.deadLetters) byKey.set(`${d.consumer.replace(`${run.runId}.`, '')}:${d.trajectoryId ?? d.error.slice(0, 40)}`, d.errorCode);
      const letters = records.deadLetters.map((d) => `${d.consumer.replace(`${run.runId}.`, '')} ${d.sourceTopic} ${d.errorCode} ${d.trajectoryId ?? ''}`);
      process.stderr.write(`# poison: ${audit.started} started, ${audit.consumedOnce} consumed once; dead letters: ${letters.join('; ')}; crashes ${sup.crashes.length}; ${((Date.now() - t0) / 1000).toFixed(0)}s\n`);
      assert.ok(done && consumed >= started, `the run did not complete: ${consumed} of ${started} consumed; crashes ${sup.crashes.join(' | ')}`);
      assert.deepEqual(audit.problems, []);
      const codes = (consumer: string, topic: string) => records.deadLetters.filter((d) => d.consumer === `${run.runId}.${consumer}` && d.sourceTopic === topic);
      const fromRollout = codes('reward', TOPICS.rolloutEvents);
      assert.deepEqual(fromRollout.map((d) => d.errorCode).sort(), ['LOG_RECORD_TOO_LARGE', 'REWARD_NON_FINITE', 'SERDE_MAGIC_BYTE', 'SERDE_UNKNOWN_SCHEMA'].sort(), letters.join('; '));
      assert.equal(fromRollout.find((d) => d.errorCode === 'REWARD_NON_FINITE')?.trajectoryId, 'poison-nan');
      assert.equal(fromRollout.find((d) => d.errorCode === 'LOG_RECORD_TOO_LARGE')?.trajectoryId, 'poison-big');
      for (const d of fromRollout) assert.ok(d.error.length > 0, 'every dead letter says why');
      const fromRewarded = codes('advantage', TOPICS.rewarded);
      assert.deepEqual(fromRewarded.map((d) => [d.errorCode, d.trajectoryId]), [['REWARD_NON_FINITE', 'poison-nan2']]);
      // Nothing poisoned reached the trainer.
      for (const id of ['poison-nan', 'poison-big', 'poison-nan2']) assert.equal(records.consumed.get(id), undefined, `${id} was trained on`);
      // ClickHouse has the dead letters too, once each.
      const rows = await clickhouse(clickhouseUrl, run.database, `SELECT error_code, count() AS n FROM dead_letters FINAL WHERE consumer != 'trace-sink' GROUP BY error_code ORDER BY error_code`);
      assert.deepEqual(
        rows.map((r) => [r['error_code'], Number(r['n'])]),
        [['LOG_RECORD_TOO_LARGE', 1], ['REWARD_NON_FINITE', 2], ['SERDE_MAGIC_BYTE', 1], ['SERDE_UNKNOWN_SCHEMA', 1]],
      );
    });
  });
}
