// Records of older logs keep their meaning when read: the serde's read path for a writer schema older than the
// current one applies core/serde/upgrades.ts after Avro's resolution. The case here: before
// RewardInfo.exclude_from_loss, DAPO's overlong filtering marked an excluded trajectory with the reward component
// shaping.truncated_masked. Stored v1 bytes (schemas/fixtures/legacy/, written once with history v1) decode with
// the field set; v1 records without the marker, and current records that merely name a component so, do not.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { EVENT_NAMES, historyVersions, type EventName } from '../../schemas/index.ts';
import { FIXTURE_DIR, currentFixtureValue, historyType, reviveBytes } from '../../schemas/snapshot.ts';
import type { AdvantagedTrajectory, RewardInfo } from '../../schemas/generated/types.ts';
import { EventSerde, subjectOf } from '../../core/serde/events.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { LEGACY_TRUNCATED_MASKED, upgradesFor } from '../../core/serde/upgrades.ts';
import { sampleFromEvent } from '../../consumers/trainer/batch.ts';
import { embeddedLog } from '../producers/helpers.ts';

const REWARDED = ['RewardedTrajectory', 'AdvantagedTrajectory'] as const;

function hex(path: string): Buffer {
  return Buffer.from(readFileSync(path, 'utf8').trim(), 'hex');
}

function framed(id: number, body: Buffer): Buffer {
  const header = Buffer.alloc(5);
  header.writeUInt32BE(id, 1);
  return Buffer.concat([header, body]);
}

/** A serde on a real embedded log's registry, with v1 of every event registered before the current schemas (an old log). */
async function oldLog() {
  const t = await embeddedLog(1);
  const registry = await EmbeddedRegistry.open(t.log);
  const v1 = new Map<EventName, number>();
  for (const name of EVENT_NAMES) v1.set(name, await registry.register(subjectOf(name), JSON.stringify(historyVersions(name)[0]!.schema)));
  const serde = await new EventSerde(registry).init();
  return { t, registry, serde, v1: (name: EventName) => v1.get(name)! };
}

test('a v1 record carrying the legacy marker reads with exclude_from_loss, and the trainer trains none of its tokens', async () => {
  const { t, registry, serde, v1 } = await oldLog();
  try {
    for (const name of REWARDED) {
      const bytes = hex(join(FIXTURE_DIR, 'legacy', `${name}.v1-truncated-masked.avro.hex`));
      // The stored bytes are what history v1 writes for the stored value: the fixture is v1's, not today's.
      const value = reviveBytes(JSON.parse(readFileSync(join(FIXTURE_DIR, 'legacy', `${name}.v1-truncated-masked.json`), 'utf8')));
      assert.ok(historyType(name, 1).toBuffer(value).equals(bytes), `${name}: legacy fixture bytes differ from history v1's encoding`);
      assert.notEqual(v1(name), serde.schemaId(name), `${name}: v1 must be an older writer schema than the current one`);
      const d = await serde.decode(framed(v1(name), bytes));
      const reward = (d.value as { reward: RewardInfo }).reward;
      assert.equal(reward.exclude_from_loss, true, `${name}: the marker becomes the field`);
      // The component stays (its value, 0, is part of the recorded score).
      assert.ok(reward.components.some((c) => c.name === LEGACY_TRUNCATED_MASKED));
      // A second read takes the synchronous path with the cached reader: upgraded the same.
      assert.equal((serde.tryDecodeSync(framed(v1(name), bytes))!.value as { reward: RewardInfo }).reward.exclude_from_loss, true);
      if (name === 'AdvantagedTrajectory') {
        const e = d.value as AdvantagedTrajectory;
        assert.ok(e.trajectory.response_mask.some((m) => m > 0), 'the fixture has trainable tokens to lose');
        assert.equal(sampleFromEvent(e, e.trajectory.min_policy_version).responseMask.reduce((a, b) => a + b, 0), 0);
      }
    }
  } finally {
    await registry.close();
    await t.cleanup();
  }
});

test('a v1 record without the marker, and a current record naming a component so, are trained on', async () => {
  const { t, registry, serde, v1 } = await oldLog();
  try {
    for (const name of REWARDED) {
      const plain = await serde.decode(framed(v1(name), hex(join(FIXTURE_DIR, `${name}.avro.hex`))));
      assert.equal((plain.value as { reward: RewardInfo }).reward.exclude_from_loss, false, `${name}: v1 without the marker`);
      // Today the field alone excludes: a reward function's component of that name is only a name.
      const current = currentFixtureValue(name) as { reward: RewardInfo };
      const named = { ...current, reward: { ...current.reward, components: [...current.reward.components, { name: LEGACY_TRUNCATED_MASKED, value: 0 }], exclude_from_loss: false } };
      const d = await serde.decode(serde.encode(name, named as never));
      assert.equal(d.schemaId, serde.schemaId(name));
      assert.equal((d.value as { reward: RewardInfo }).reward.exclude_from_loss, false, `${name}: current record`);
    }
  } finally {
    await registry.close();
    await t.cleanup();
  }
});

test('the upgrade is chosen by what the writer schema lacks: only rewarded records written before the field', () => {
  for (const name of EVENT_NAMES) {
    for (const h of historyVersions(name)) {
      const applies = upgradesFor(historyType(name, h.version)).length > 0;
      // RewardInfo gained exclude_from_loss in v2 of both; ToolCallCompleted's `reward` is a number, not a RewardInfo.
      const expected = (REWARDED as readonly string[]).includes(name) && h.version === 1;
      assert.equal(applies, expected, `${name} v${h.version}`);
    }
  }
});
