// Chaos on the distributed shape: every role (rollout, reward, advantage, trainer, traces) its own process on
// Kafka (a private broker), the HTTP registry and ClickHouse; a random role is SIGKILLed every few seconds (20
// kills, every role at least twice) and restarted. At the end every started trajectory is in the trainer's
// consumed set exactly once or accounted for as aborted / dead-lettered, train steps and policy versions are
// contiguous and unique, and ClickHouse holds no duplicate. On each Kafka client (log.client of every role).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { EventSerde } from '../../core/serde/events.ts';
import { openRegistryFor } from '../../core/serde/open.ts';
import { kafkaClients, service } from '../kafka/services.ts';
import { auditRun, collectRun, stuck, stuckDetail, traceDuplicates } from '../../testkit/audit.ts';
import { drainRun, withPrivateRun } from './scenario.ts';
import { progress, ROLES, type Role } from '../../testkit/harness.ts';

const KILLS = 16;

function killPlan(seed: number): Role[] {
  let s = seed;
  const rand = () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const plan: Role[] = [...ROLES, ...ROLES];
  while (plan.length < KILLS) plan.push(ROLES[Math.floor(rand() * ROLES.length)]!);
  for (let i = plan.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [plan[i], plan[j]] = [plan[j]!, plan[i]!];
  }
  return plan;
}

const registry = service('SCHEMA_REGISTRY_URL', 'chaos: SIGKILLed roles on Kafka');
const clickhouseUrl = registry ? service('CLICKHOUSE_URL', 'chaos: SIGKILLed roles on Kafka') : null;
for (const client of registry && clickhouseUrl ? kafkaClients('chaos: SIGKILLed roles on Kafka') : []) {
  test(`${KILLS} SIGKILLs of random roles: every trajectory consumed once, versions contiguous, no duplicate trace (${client})`, { timeout: 360_000 }, async (t) => {
    const t0 = Date.now();
    await withPrivateRun(t, 'chaos', { 'log.client': client }, async (s) => {
      const { log, run, sup } = s;
      sup.start();
      // Kills start once the pipeline is alive (rollout events are flowing).
      const aliveBy = Date.now() + 60_000;
      while (Date.now() < aliveBy && ((await progress(log, run.runId).catch(() => null))?.rolloutEvents ?? 0) === 0) await sleep(500);
      const plan = killPlan(Date.now() % 1000);
      const tKills = Date.now();
      const killed: Record<Role, number> = { rollout: 0, reward: 0, advantage: 0, trainer: 0, traces: 0 };
      for (const role of plan) {
        await sleep(2000 + Math.random() * 1500);
        await sup.kill(role);
        killed[role]++;
      }
      const killSecs = (Date.now() - tKills) / 1000;
      const mid = await progress(log, run.runId).catch(() => null);
      // Drain: the last rollout life finishes the dataset; the trainer consumes every started trajectory.
      const serde = await new EventSerde(await openRegistryFor(log, { url: registry! })).init();
      const note = (what: string) => process.stderr.write(`# chaos (${client}) ${((Date.now() - t0) / 1000).toFixed(0)}s: ${what}\n`);
      note(`kills done ${JSON.stringify(mid)}`);
      const { rolloutDone, started, consumed } = await drainRun(s, serde, 60_000, async (d) => void note(`rollout done: ${d.rolloutDone}; consumed ${d.consumed} of ${d.started} started; ${JSON.stringify(await progress(log, run.runId).catch(() => null))}`));
      const p = await progress(log, run.runId).catch(() => null);
      // The trace sink catches up on every topic it reads.
      const sinkBy = Date.now() + 40_000;
      for (;;) {
        let lag = 0;
        for (const topic of ['rollout.events', 'rewarded', 'advantaged', 'train.steps', 'policy.versions']) lag += (await log.lag(`${run.runId}.traces`, topic).catch(() => [{ lag: 1 }])).reduce((n, l) => n + l.lag, 0);
        if (lag === 0 || Date.now() > sinkBy) break;
        await sleep(500);
      }
      await sup.stopAll();

      const records = await collectRun(log, serde, run.runId);
      const audit = auditRun(records);
      const diag =
        `(${killSecs.toFixed(0)}s of kills, ${((Date.now() - t0) / 1000).toFixed(0)}s in all; progress when the kills ended ${JSON.stringify(mid)}, at the end ${JSON.stringify(p)}; ` +
        `crashes: ${sup.crashes.join(' | ')}; audit ${JSON.stringify(audit)}; stuck ${JSON.stringify(stuck(records))})`;
      const st = stuck(records);
      if (st['notAdvantaged']!.length > 0) process.stderr.write(`# chaos stuck: ${await stuckDetail(log, serde, run.runId, 'advantage', st['notAdvantaged']!)}\n`);
      assert.ok(rolloutDone, `the rollout worker did not finish its dataset ${diag}`);
      assert.ok(consumed >= started, `the trainer did not consume every trajectory: ${consumed} of ${started} ${diag}`);
      const traces = await traceDuplicates(clickhouseUrl!, run.database, run.runId);
      process.stderr.write(
        `# chaos (${client}): ${KILLS} kills in ${killSecs.toFixed(0)}s (${ROLES.map((r) => `${r} ${killed[r]}`).join(', ')}); starts ${JSON.stringify(sup.starts)}; ` +
          `progress when the kills ended ${JSON.stringify(mid)}; crashes (restarted) ${sup.crashes.length}; ` +
          `${audit.started} started: ${audit.consumedOnce} consumed once, ${audit.aborted} aborted, ${audit.deadLettered} dead-lettered, ${audit.superseded} superseded (rerun after a crash); ` +
          `rollout duplicates of TrajectoryCompleted ${[...records.completed.values()].filter((n) => n > 1).length}; traces ${JSON.stringify(traces.tables)}; ${((Date.now() - t0) / 1000).toFixed(0)}s\n`,
      );
      for (const r of ROLES) assert.ok(killed[r] >= 2, `${r} killed ${killed[r]} times`);
      assert.deepEqual(audit.problems, [], diag);
      assert.equal(audit.started, 24 * 4, 'every row of the dataset started its group');
      assert.deepEqual(traces.problems, []);
      assert.equal(traces.tables['train_steps']!.final, records.steps.length);
      assert.equal(traces.tables['policy_versions']!.final, records.versions.length);
      assert.equal(traces.tables['trajectories']!.final, records.completed.size);
      assert.equal(traces.tables['trajectory_starts']!.final, records.started.size);
    });
  });
}
