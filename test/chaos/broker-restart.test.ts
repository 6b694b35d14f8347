// Broker restart mid-run: the distributed shape (every role its own process) on a private Kafka broker that is
// stopped while trajectories are flowing and started again some seconds later. Roles that give up during the
// outage are restarted, as a supervisor would; the pipeline resumes and nothing is lost: every started
// trajectory is consumed by the trainer exactly once and steps / versions stay contiguous. On each Kafka client.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { EventSerde } from '../../core/serde/events.ts';
import { openRegistryFor } from '../../core/serde/open.ts';
import { kafkaClients, service } from '../kafka/services.ts';
import { auditRun, collectRun, consumedIds, stuck, stuckDetail } from '../../testkit/audit.ts';
import { drainRun, withPrivateRun } from './scenario.ts';
import { TXN_DEADLINE_MS } from '../../core/log/kafka/librdkafka/producer.ts';
import { openRunLog, progress } from '../../testkit/harness.ts';

// What each role did, across its restarts, for a failure: restores, the trainer's commits, assignments and their
// offsets, transactions retried or confirmed, and the error a role exited with.
const STORY = /^rlstream:|"msg":"(restored from the log|restore: no progress[^"]*|resumed from checkpoint|committing step|published initial policy version|assigned|restored checkpoint|checkpoint[^"]*|transaction across a broker outage confirmed|transaction failed; retrying it with a new producer|could not resolve start offsets after a group join)"/;

/** A kept line, shortened: time, pid, message and the fields that say where. */
function brief(line: string): string {
  if (!line.startsWith('{')) return line.slice(0, 300);
  try {
    const o = JSON.parse(line) as Record<string, unknown>;
    const at = ['step', 'version', 'topic', 'end', 'offsets', 'groupId', 'error'].filter((k) => o[k] !== undefined).map((k) => `${k}=${typeof o[k] === 'string' ? (o[k] as string).slice(0, 160) : JSON.stringify(o[k])}`);
    return `${String(o['t']).slice(11, 23)} ${String(o['pid'])} ${String(o['msg'])} ${at.join(' ')}`;
  } catch {
    return line.slice(0, 300);
  }
}

const registry = service('SCHEMA_REGISTRY_URL', 'Kafka broker restart mid-run');
for (const client of registry && service('CLICKHOUSE_URL', 'Kafka broker restart mid-run') ? kafkaClients('Kafka broker restart mid-run') : []) {
  test(`Kafka stopped and restarted mid-run: the pipeline resumes and nothing is lost (${client})`, { timeout: 240_000 }, async (t) => {
    const t0 = Date.now();
    await withPrivateRun(t, 'restart', { 'task.train_rows': 12, 'log.client': client }, async (s) => {
      const { broker, run, sup } = s;
      let log = s.log;
      sup.keepStory('debug', STORY);
      sup.start();
      // Stop the broker once training is under way (some trajectories consumed, more still to come).
      const serde = await new EventSerde(await openRegistryFor(log, { url: registry! })).init();
      const by = Date.now() + 75_000;
      let before = 0;
      while (Date.now() < by && (before = new Set(await consumedIds(log, serde, run.runId).catch(() => [])).size) < 4) await sleep(200);
      const mid = await progress(log, run.runId).catch(() => null);
      await log.close();
      await broker.halt('SIGTERM');
      const tDown = Date.now();
      await sleep(5000);
      await broker.resume();
      const outage = (Date.now() - tDown) / 1000;
      log = s.log = await openRunLog(broker.brokers);

      // Longer than a role's deadline on a Kafka call that never returns plus its restart: a role that stops on
      // such a call is restarted, and the test waits for that recovery too.
      const { rolloutDone: done, started, consumed } = await drainRun(s, serde, TXN_DEADLINE_MS + 50_000);
      const end = await progress(log, run.runId).catch(() => null);
      const trainerTail = sup.procs.get('trainer')?.output.slice(-1500) ?? '';
      const rolloutTail = sup.procs.get('rollout')?.output.slice(-1500) ?? '';
      // The stream processors' warnings and errors (transactions retried or failed, rebalances), for a failure.
      const processorNotes = (['reward', 'advantage'] as const)
        .map((role) => `${role}: ${(sup.procs.get(role)?.output ?? '').split('\n').filter((l) => /"level":"(warn|error)"/.test(l) && !/kafkajs|"fac":/.test(l)).slice(-12).join('\n')}`)
        .join('\n');
      await sup.stopAll();
      const records = await collectRun(log, serde, run.runId);
      const audit = auditRun(records);
      process.stderr.write(
        `# broker restart (${client}): ${before} trajectories consumed when the broker stopped (${JSON.stringify(mid)}); outage ${outage.toFixed(1)}s; ` +
          `starts ${JSON.stringify(sup.starts)}; ${audit.started} started, ${audit.consumedOnce} consumed once; ${records.steps.length} steps; ${((Date.now() - t0) / 1000).toFixed(0)}s\n`,
      );
      const where = stuck(records);
      // Where trajectories stopped before the trainer: their records on rewarded with the advantage consumer's
      // offsets and checkpoints, and any dead letters of theirs.
      const detail =
        audit.consumedOnce === audit.started
          ? ''
          : [await stuckDetail(log, serde, run.runId, 'reward', where['notRewarded']!).catch((e: unknown) => String(e)), await stuckDetail(log, serde, run.runId, 'advantage', where['notAdvantaged']!).catch((e: unknown) => String(e))].join('; ');
      const lost = new Set(Object.values(where).flat());
      const deadOfLost = records.deadLetters.filter((d) => d.trajectoryId !== null && lost.has(d.trajectoryId)).map((d) => `${d.consumer} ${d.errorCode}`);
      const story = (['trainer', 'reward', 'advantage'] as const).map((role) => `${role}:\n${sup.storyOf(role).map(brief).join('\n')}`).join('\n');
      // The trainer's lives in a few lines (starts, restores, exits), first in a failure: CI keeps the start of a
      // long message and cuts its middle.
      const lives = sup.storyOf('trainer').map(brief).filter((l) => /started|restored|resumed|published initial|exited|rlstream:/.test(l)).join('\n');
      const diag = `crashes: ${sup.crashes.join(' | ').slice(0, 1500)}; stuck ${JSON.stringify(where)}; ${detail}; dead letters of those ${JSON.stringify(deadOfLost)}; progress at the end ${JSON.stringify(end)}; trainer: ${trainerTail}; rollout: ${rolloutTail}; ${processorNotes}`;
      assert.ok(before >= 4 && before < started, `the broker did not stop mid-run (${before} consumed of ${started})`);
      assert.ok(done, `the rollout worker did not finish after the restart; ${diag}`);
      assert.equal(started, 48, 'every row started its group');
      assert.ok(consumed >= started, `${consumed} of ${started} consumed; what the roles did:\n${story}\n${diag}`);
      // The problems first: CI shows the end of its log, and the roles' output in diag is long.
      assert.deepEqual(audit.problems, [], `${audit.problems.slice(0, 10).join('; ')}; the trainer's lives:\n${lives}\nwhat the roles did:\n${story}\n${diag}`);
      assert.equal(audit.consumedOnce, audit.started, `nothing lost, nothing aborted; ${JSON.stringify(audit)}`);
    });
  });
}
