// Group timeouts run on the log's clock (record timestamps), not the consumer's: a consumer far behind its input
// (slow, restarted, replaying) closes no group whose members are still unread, and the groups it does close by
// timeout are the same whenever the log is read. The wall clock closes a group only in a partition read to its end.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AdvantageHandler, type AdvantageOptions } from '../../consumers/advantage/consumer.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog, ProduceRecord } from '../../core/log/types.ts';
import { StreamProcessor, type ProcessContext } from '../../core/processor.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { AdvantagedTrajectory } from '../../schemas/generated/types.ts';
import { readTopic } from '../../testkit/audit.ts';
import { rng } from '../../core/random.ts';
import { newSerde, rewarded, tempDir, trajectory } from '../../testkit/events.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** An advantage handler that takes `delayMs` over every batch: a consumer that cannot keep up with its input. */
class SlowAdvantage extends AdvantageHandler {
  constructor(id: string, options: AdvantageOptions, private readonly delayMs: number) {
    super(id, options);
  }
  override async tick(ctx: ProcessContext): Promise<void> {
    await sleep(this.delayMs);
    await super.tick(ctx);
  }
}

function member(serde: EventSerde, groupId: string, index: number, groupSize: number, timestamp: number): ProduceRecord {
  const t = trajectory({ groupId, index, groupSize, tokens: 12 });
  return { key: groupId, value: serde.encode('RewardedTrajectory', rewarded(t, index % 2)), timestamp };
}

/** Run one processor over `input` until it has read everything and holds nothing; its outputs and counters. */
async function consume(log: EventLog, serde: EventSerde, id: string, handler: AdvantageHandler, batch: number) {
  const out = `out-${id}`;
  await log.createTopic({ name: out, partitions: 1 });
  const proc = new StreamProcessor({ id, log, serde, inputTopics: ['in'], accepts: ['RewardedTrajectory'], handler, maxBatchRecords: batch, deadLetterTopic: `dlq-${id}` });
  const running = proc.run();
  const deadline = Date.now() + 60_000;
  while ((await proc.lag()) > 0 || handler.openGroups > 0) {
    assert.ok(Date.now() < deadline, 'the consumer did not finish within 60 s');
    await sleep(50);
  }
  await proc.stop();
  await running;
  const events: AdvantagedTrajectory[] = [];
  await readTopic(log, out, async (v) => void events.push((await serde.decode(v)).value as AdvantagedTrajectory));
  return { events, counters: proc.metrics().counters };
}

/** Each group as emitted: its members present and whether it went out partial. */
function groupsOf(events: AdvantagedTrajectory[]): Map<string, { members: string[]; partial: boolean }> {
  const out = new Map<string, { members: string[]; partial: boolean }>();
  for (const e of events) {
    const g = out.get(e.trajectory.group_id) ?? { members: [], partial: e.group.partial };
    g.members.push(e.trajectory.trajectory_id);
    out.set(e.trajectory.group_id, g);
  }
  for (const g of out.values()) g.members.sort();
  return out;
}

test('a consumer far behind its input closes no group early: members spread over many slow batches all arrive', { timeout: 120_000 }, async () => {
  const log = await openLog({ kind: 'embedded', dir: tempDir('adv-behind') });
  await log.createTopic({ name: 'in', partitions: 2 });
  const serde = await newSerde();
  // Written an hour ago, members of a group up to 60 records apart: the consumer reads them in batches of 5, 40 ms
  // each, so a group's last member comes ~0.5 s after its first, five times the 100 ms timeout. On the wall clock
  // every group would close early; on the log's clock none does, and only the short groups close, at the end.
  const t0 = Date.now() - 3_600_000;
  const records: ProduceRecord[] = [];
  for (let g = 0; g < 30; g++) for (let i = 0; i < (g % 10 === 3 ? 5 : 8); i++) records.push(member(serde, `g${g}`, i, 8, t0));
  let s = 7;
  for (let i = 0; i < records.length; i++) {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    const j = Math.min(records.length - 1, i + Math.floor((s / 2 ** 31) * 60));
    [records[i], records[j]] = [records[j]!, records[i]!];
  }
  const p = await log.producer();
  await p.send('in', records);
  await p.close();

  const handler = new SlowAdvantage('slow', { outputTopic: 'out-slow', groupTimeoutMs: 100, partialGroups: 'emit' }, 40);
  const { events, counters } = await consume(log, serde, 'slow', handler, 5);
  const groups = groupsOf(events);
  assert.equal(groups.size, 30);
  for (const [id, g] of groups) {
    const short = Number(id.slice(1)) % 10 === 3;
    assert.deepEqual({ id, n: g.members.length, partial: g.partial }, { id, n: short ? 5 : 8, partial: short });
  }
  assert.equal(counters['late_members'] ?? 0, 0);
  assert.equal(counters['partial_timeout'], 3);
  await log.close();
});

test("the log's clock closes a group its partition has moved past, and a replay closes the same groups", { timeout: 120_000 }, async () => {
  const log = await openLog({ kind: 'embedded', dir: tempDir('adv-clock') });
  await log.createTopic({ name: 'in', partitions: 1 });
  const serde = await newSerde();
  // One partition. Group a gets 4 of 8 members at t0; 20 minutes later (past the 10-minute timeout) group b is
  // written, then a's fifth member. The wall clock cannot close anything within this test (10 minutes); the
  // partition's clock does: b's first record closes a partial, and a's fifth member is late.
  const t0 = Date.now() - 7_200_000;
  const later = t0 + 20 * 60_000;
  const records = [0, 1, 2, 3].map((i) => member(serde, 'a', i, 8, t0));
  records.push(...[0, 1, 2, 3].map((i) => member(serde, 'b', i, 4, later)), member(serde, 'a', 4, 8, later));
  const p = await log.producer();
  await p.send('in', records);
  await p.close();

  const runs = [];
  for (const id of ['live', 'replay']) {
    const handler = new AdvantageHandler(id, { outputTopic: `out-${id}`, groupTimeoutMs: 600_000, partialGroups: 'emit' });
    runs.push(await consume(log, serde, id, handler, id === 'live' ? 100 : 1));
  }
  for (const { events, counters } of runs) {
    const groups = groupsOf(events);
    assert.deepEqual(Object.fromEntries(groups), { a: { members: ['a/0', 'a/1', 'a/2', 'a/3'], partial: true }, b: { members: ['b/0', 'b/1', 'b/2', 'b/3'], partial: false } });
    assert.equal(counters['late_members'], 1);
    assert.equal(counters['partial_timeout'], 1);
  }
  await log.close();
});

test('generated logs: any batch size closes the same groups, and every trajectory is emitted once or counted late', { timeout: 120_000 }, async () => {
  // Each seed writes 40 groups of 2-6 over 3 partitions: a fifth of the members never written, a tenth written
  // 15-30 minutes after their group's first (past the 10-minute timeout: late), the rest within 2 minutes, in
  // timestamp order shuffled within a window. A consumer reading 1, 7 or 200 records a batch must close the same
  // groups with the same members (replay = live), and lose and duplicate nothing.
  const serde = await newSerde();
  for (const seed of [1, 2, 3, 4, 5]) {
    const r = rng(seed);
    const log = await openLog({ kind: 'embedded', dir: tempDir('adv-gen') });
    await log.createTopic({ name: 'in', partitions: 3 });
    const t0 = Date.now() - 24 * 3_600_000;
    const written: { rec: ProduceRecord; ts: number }[] = [];
    for (let g = 0; g < 40; g++) {
      const size = 2 + Math.floor(r() * 5);
      const start = t0 + Math.floor(r() * 3_600_000);
      for (let i = 0; i < size; i++) {
        if (i > 0 && r() < 0.2) continue;
        const ts = start + (i > 0 && r() < 0.1 ? 900_000 + Math.floor(r() * 900_000) : Math.floor(r() * 120_000));
        written.push({ rec: member(serde, `s${seed}g${g}`, i, size, ts), ts });
      }
    }
    written.sort((a, b) => a.ts - b.ts);
    for (let i = 0; i < written.length; i++) {
      const j = Math.min(written.length - 1, i + Math.floor(r() * 4));
      [written[i], written[j]] = [written[j]!, written[i]!];
    }
    // Each partition ends with a one-member group a day later: its timestamp moves every partition's clock past
    // every group above, so the log alone closes them all (the wall clock would wait the 10 minutes).
    const tail = [0, 1, 2].map((partition) => ({ ...member(serde, `s${seed}end${partition}`, 0, 1, t0 + 24 * 3_600_000), partition }));
    const p = await log.producer();
    await p.send('in', [...written.map((w) => w.rec), ...tail]);
    await p.close();

    const seen: string[] = [];
    for (const batch of [1, 7, 200]) {
      const id = `gen${seed}-b${batch}`;
      const handler = new AdvantageHandler(id, { outputTopic: `out-${id}`, groupTimeoutMs: 600_000, partialGroups: 'emit' });
      const { events, counters } = await consume(log, serde, id, handler, batch);
      const ids = events.map((e) => e.trajectory.trajectory_id);
      assert.equal(new Set(ids).size, ids.length, `seed ${seed}, batch ${batch}: a trajectory emitted twice`);
      assert.equal(ids.length + (counters['late_members'] ?? 0), written.length + tail.length, `seed ${seed}, batch ${batch}: emitted + late != written`);
      assert.ok((counters['late_members'] ?? 0) > 0 && (counters['partial_timeout'] ?? 0) > 0, `seed ${seed}: the log has late members and partial groups`);
      seen.push(JSON.stringify([...groupsOf(events)].sort(([a], [b]) => a.localeCompare(b))));
    }
    assert.equal(seen[1], seen[0], `seed ${seed}: batches of 7 closed other groups than batches of 1`);
    assert.equal(seen[2], seen[0], `seed ${seed}: batches of 200 closed other groups than batches of 1`);
    await log.close();
  }
});

test("a writer's clock an hour behind this machine's closes no group early: the wall clock counts from when the consumer read it", { timeout: 120_000 }, async () => {
  const log = await openLog({ kind: 'embedded', dir: tempDir('adv-skew') });
  await log.createTopic({ name: 'in', partitions: 1 });
  await log.createTopic({ name: 'out-skew', partitions: 1 });
  const serde = await newSerde();
  // The rollout machine's clock runs an hour behind: every record it writes is stamped an hour ago. Group "slow"
  // gets its second member 1.5 s after its first, within the 3 s timeout: it must close complete. Group "quiet"
  // never gets its second member: the wall clock must still close it, partial, ~3 s after the consumer read it.
  const behind = () => Date.now() - 3_600_000;
  const handler = new AdvantageHandler('skew', { outputTopic: 'out-skew', groupTimeoutMs: 3000, partialGroups: 'emit' });
  const proc = new StreamProcessor({ id: 'skew', log, serde, inputTopics: ['in'], accepts: ['RewardedTrajectory'], handler, maxBatchWaitMs: 50, deadLetterTopic: 'dlq-skew' });
  const running = proc.run();
  const p = await log.producer();
  try {
    await p.send('in', [member(serde, 'slow', 0, 2, behind()), member(serde, 'quiet', 0, 2, behind())]);
    const read = Date.now();
    // Read to the end within this (the processor polls every 100 ms), with the groups an hour old by the writer's
    // stamps. (proc.lag() cannot tell: the held groups keep the commit below them.)
    await sleep(1500);
    assert.equal(handler.openGroups, 2, 'both groups are held 1.5 s after they were written');
    await p.send('in', [member(serde, 'slow', 1, 2, behind())]);
    const deadline = Date.now() + 30_000;
    while (handler.openGroups > 0) {
      assert.ok(Date.now() < deadline, 'group "quiet" did not close within 30 s');
      await sleep(50);
    }
    assert.ok(Date.now() - read >= 3000, `group "quiet" closed ${Date.now() - read} ms after it was written, before the 3 s timeout`);
  } finally {
    await p.close();
    await proc.stop();
    await running;
  }
  const events: AdvantagedTrajectory[] = [];
  await readTopic(log, 'out-skew', async (v) => void events.push((await serde.decode(v)).value as AdvantagedTrajectory));
  assert.deepEqual(Object.fromEntries(groupsOf(events)), { slow: { members: ['slow/0', 'slow/1'], partial: false }, quiet: { members: ['quiet/0'], partial: true } });
  assert.equal(proc.metrics().counters['late_members'] ?? 0, 0);
  await log.close();
});
