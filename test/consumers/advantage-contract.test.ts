// What the advantage consumer does with records an outside producer gets wrong (docs/events.md): a sample_index
// not below group_size or a group_size other than its group's is dead-lettered with the reason; a split other
// than train, a partial group and a late member are logged once with the reason instead of passing silently.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createAdvantageProcessor } from '../../consumers/advantage/consumer.ts';
import { openLog } from '../../core/log/open.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { AdvantagedTrajectory, DeadLetter } from '../../schemas/generated/types.ts';
import { newSerde, rewarded, tempDir, trajectory } from '../../testkit/events.ts';

test('bad group membership is dead-lettered with its reason; skipped and partial records are warned about', async () => {
  const log = await openLog({ kind: 'embedded', dir: tempDir('adv-contract') });
  for (const name of Object.values(TOPICS)) await log.createTopic({ name, partitions: 1 });
  const serde = await newSerde();
  const p = await log.producer();
  const send = (groupId: string, index: number, size: number, split = 'train') =>
    p.send(TOPICS.rewarded, [{ key: groupId, value: serde.encode('RewardedTrajectory', rewarded(trajectory({ groupId, index, groupSize: size, tokens: 12, split }), index)) }]);
  await send('ok', 0, 2);
  await send('ok', 1, 2);
  await send('over', 2, 2); // sample_index 2 in a group of 2
  await send('mixed', 0, 3);
  await send('mixed', 1, 2); // another group_size than the group's first member
  await send('eval', 0, 1, 'validation');
  await send('heldout', 0, 1, 'heldout'); // the run's own evaluations: skipped without a warning
  await send('short', 0, 4); // never completes
  const lines: Record<string, unknown>[] = [];
  const logger = jsonLogger({ level: 'warn', write: (line) => lines.push(JSON.parse(line) as Record<string, unknown>) });
  const proc = createAdvantageProcessor({ log, serde, groupTimeoutMs: 200, logger });
  const running = proc.run();
  await new Promise((r) => setTimeout(r, 900));
  await proc.stop();
  await running;

  const read = async (topic: string) => {
    const c = await log.consumer({ groupId: `read-${topic}`, topics: [topic] });
    const out = [];
    for (let empty = 0; empty < 2; ) {
      const b = await c.poll({ maxRecords: 1000, timeoutMs: 100 });
      if (b.length === 0) empty++;
      for (const r of b) out.push((await serde.decode(r.value)).value);
    }
    await c.close();
    return out;
  };
  const advantaged = (await read(TOPICS.advantaged)) as AdvantagedTrajectory[];
  assert.deepEqual([...new Set(advantaged.map((a) => a.trajectory.group_id))].sort(), ['mixed', 'ok', 'short']);
  const dead = (await read(TOPICS.deadLetter)) as DeadLetter[];
  const reasons = dead.map((d) => d.error).join('\n');
  assert.equal(dead.length, 2, reasons);
  assert.match(reasons, /sample_index 2 is not below group_size 2/);
  assert.match(reasons, /group_size 2 differs from 3/);
  const messages = lines.map((l) => String(l['msg']));
  assert.ok(messages.some((m) => /only dataset.split "train"/.test(m)), messages.join('\n'));
  assert.ok(lines.some((l) => l['split'] === 'validation'));
  assert.ok(!lines.some((l) => l['split'] === 'heldout'), 'held-out evaluations are expected, not warned about');
  assert.ok(messages.some((m) => /group closed partial \(timeout\)/.test(m)), messages.join('\n'));
  await log.close();
});
