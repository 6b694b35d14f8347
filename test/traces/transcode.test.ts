// The sink's native transcoders (Avro bytes straight to RowBinary) against the general path (decode, rowsOf,
// the table codec): for every event type that has a plan, on each target's real table columns, the two give
// the same bytes for a synthetic run and for edge values; where the column rules would convert a value (NaN,
// a null in a non-nullable number) or the record is damaged, the transcoder declines and writes nothing, and
// the records around it in the same batch are still written.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde, type DecodedEvent } from '../../core/serde/events.ts';
import { RowBinaryBuffer, type TableCodec } from '../../core/traces/rowbinary.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { rowsOf } from '../../consumers/traces/rows.ts';
import { compileTranscoder, PLANS, type Transcoder } from '../../consumers/traces/transcode.ts';
import { resolvedSchema, type EventName } from '../../schemas/index.ts';
import type { EventTypes } from '../../schemas/generated/types.ts';
import { syntheticRun } from '../../testkit/synthetic-run.ts';
import { targets } from './targets.ts';

const PLANNED = Object.keys(PLANS) as EventName[];

/** Synthetic events of every planned type, then edge variants of the first of each. */
function events(): { name: EventName; value: unknown }[] {
  const out: { name: EventName; value: unknown }[] = [];
  const first = new Map<EventName, unknown>();
  for (const ev of syntheticRun({ groups: 6, groupSize: 4, assistantTurns: 3, tokensPerTurn: 9, trajectoriesPerStep: 8, seed: 11 })) {
    if (!PLANNED.includes(ev.name)) continue;
    out.push({ name: ev.name, value: ev.value });
    if (!first.has(ev.name)) first.set(ev.name, ev.value);
  }
  const turn = first.get('TurnCompleted') as EventTypes['TurnCompleted'];
  const long = 'é ✓ 𝄞 \t\n\\ "quoted" ' + 'x'.repeat(300);
  out.push(
    { name: 'TurnCompleted', value: { ...turn, text: long, token_ids: [0, 127, 128, 16383, 16384, 2 ** 21, 2 ** 28 - 1, 2 ** 28, 2 ** 31 - 1], logprobs: [-0, 1e-40, -3.5, 0, 1, 2, 3, 4, 5], response_mask: [0, 1, 1, 0, 1, 1, 1, 1, 1], finish_reason: null, server: null, tool_call_parse_error: null, tokenization_mismatch: true, policy_version: -1 } },
    { name: 'TurnCompleted', value: { ...turn, token_ids: [], logprobs: [], response_mask: [], tool_calls: [], text: '', finish_reason: 'stop', server: 'http://s:1', tool_call_parse_error: '' } },
    { name: 'TurnCompleted', value: { ...turn, tool_calls: [{ id: 'c1', name: 'ünïcode', arguments_json: '{"x": "🙂"}' }, { id: 'c2', name: 'calc', arguments_json: long }] } },
    { name: 'TurnCompleted', value: { ...turn, token_ids: Array.from({ length: 5000 }, (_, i) => (i * 7919) % 200_000), logprobs: Array.from({ length: 5000 }, (_, i) => -i / 1000), response_mask: Array.from({ length: 5000 }, (_, i) => i % 2), text: 'y'.repeat(70_000) } },
  );
  const tool = first.get('ToolCallCompleted') as EventTypes['ToolCallCompleted'];
  out.push({ name: 'ToolCallCompleted', value: { ...tool, metrics: [], result_text: long } }, { name: 'ToolCallCompleted', value: { ...tool, metrics: [{ name: 'a', value: -0 }, { name: 'b', value: 1e300 }] } });
  const rewarded = first.get('RewardedTrajectory') as EventTypes['RewardedTrajectory'];
  for (const correct of [null, true, false]) out.push({ name: 'RewardedTrajectory', value: { ...rewarded, reward: { ...rewarded.reward, correct, token_rewards: correct === null ? null : [0.5, -0, 1e-3], components: correct ? [] : [{ name: 'format', value: 0.25 }] } } });
  const adv = first.get('AdvantagedTrajectory') as EventTypes['AdvantagedTrajectory'];
  out.push({ name: 'AdvantagedTrajectory', value: { ...adv, advantages: adv.advantages.map((x, i) => (i === 0 ? -0 : x)), group: { ...adv.group, partial: !adv.group.partial } } });
  // JSON columns (tools_json, sampling_json): escapes, unicode, and numbers in every form JSON.stringify takes.
  const started = first.get('TrajectoryStarted') as EventTypes['TrajectoryStarted'];
  const tools = [
    { name: 'calc', description: 'quotes " and \\ backslash, \n newline \t tab \r \b \f and \u0001 \u001f \u007f', parameters_json: '{"type":"object","properties":{"x":{"type":"number"}}}' },
    { name: 'ünïcode ✓ 𝄞 \u2028', description: '', parameters_json: '{}' },
  ];
  for (const sampling of [
    { temperature: 0.7, top_p: 1e-7, top_k: 40, max_new_tokens: 2 ** 31 - 1, seed: 2 ** 40, stop_token_ids: [] },
    { temperature: 3.4e38, top_p: 1e-30, top_k: 0, max_new_tokens: 0, seed: -5, stop_token_ids: [1, 2, 150000] },
    { temperature: 123456789, top_p: 0.000001, top_k: -1, max_new_tokens: 1, seed: null, stop_token_ids: [0] },
    { temperature: -0, top_p: 1.5e21, top_k: 0, max_new_tokens: 1, seed: 0, stop_token_ids: [] },
  ]) {
    out.push({ name: 'TrajectoryStarted', value: { ...started, tools, sampling } });
  }
  out.push({ name: 'TrajectoryStarted', value: { ...started, tools: [], prompt_messages: [], prompt_token_ids: [] } });
  // A JSON column's field repeated, changed to bytes of the same length, and back (the native memo of the last
  // JSON written per column must miss on the change and hit on the repeats).
  const sameLength = tools.map((t, i) => (i === 0 ? { ...t, name: 'cale' } : t));
  for (const ts of [tools, sameLength, sameLength, tools]) out.push({ name: 'TrajectoryStarted', value: { ...started, tools: ts } });
  const done = first.get('TrajectoryCompleted') as EventTypes['TrajectoryCompleted'];
  out.push({ name: 'TrajectoryCompleted', value: { ...done, trajectory: { ...done.trajectory, response_text: long, dataset: { ...done.trajectory.dataset, index: 2 ** 40 } } } });
  return out;
}

async function withSerde(body: (serde: EventSerde) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-transcode-'));
  const log = openEmbeddedLog({ dir, fsync: 'none' });
  const registry = await EmbeddedRegistry.open(log);
  try {
    await body(await new EventSerde(registry).init());
  } finally {
    await registry.close();
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

async function transcoders(store: TraceStore): Promise<Map<EventName, { t: Transcoder; codec: TableCodec }>> {
  const out = new Map<EventName, { t: Transcoder; codec: TableCodec }>();
  for (const name of PLANNED) {
    const plan = PLANS[name]!;
    const codec = await store.rowCodec(plan.table);
    assert.ok(codec, `${plan.table} has a RowBinary codec`);
    const t = compileTranscoder(resolvedSchema(name), plan, codec.columns);
    assert.ok(t, `${name} compiles a transcoder for ${plan.table} (${store.dialect})`);
    out.set(name, { t, codec });
  }
  return out;
}

/** The general path's bytes for one record. */
function generalRow(serde: EventSerde, codec: TableCodec, bytes: Buffer): Buffer {
  const out = new RowBinaryBuffer(64);
  const rows = rowsOf(serde.tryDecodeSync(bytes) as DecodedEvent);
  assert.equal(rows.length, 1);
  codec.append(out, rows[0]!.row);
  return Buffer.from(out.payload());
}

for (const target of targets()) {
  test(`transcoders write the same RowBinary as decode + rowsOf + codec (${target.name})`, { skip: target.skip ?? false, timeout: 60_000 }, async () => {
    const store = await target.open('transcode');
    try {
      const ts = await transcoders(store);
      await withSerde(async (serde) => {
        const byName = new Map<EventName, Buffer[]>();
        for (const ev of events()) {
          const list = byName.get(ev.name) ?? [];
          list.push(serde.encode(ev.name, ev.value as never));
          byName.set(ev.name, list);
        }
        for (const name of PLANNED) {
          const records = byName.get(name) ?? [];
          assert.ok(records.length >= 2, `${name}: ${records.length} events compared`);
          const { t, codec } = ts.get(name)!;
          // A small buffer: the batch must grow it part way (the 70 kB turn needs more than 64 bytes).
          const fast = new RowBinaryBuffer(64);
          const status = new Uint8Array(records.length);
          assert.equal(t.append(records, fast, status), records.length, `${name}: every record transcoded`);
          assert.deepEqual([...status], records.map(() => 1));
          assert.equal(fast.rows, records.length);
          const general = Buffer.concat(records.map((r) => generalRow(serde, codec, r)));
          assert.deepEqual(fast.payload(), general, `${name} row bytes (${target.name})`);
          // The same records in one buffer, as a log read holds them: one native call for the whole batch.
          const chunk = Buffer.concat(records);
          let at = 0;
          const views = records.map((r) => chunk.subarray(at, (at += r.length)));
          const whole = new RowBinaryBuffer(64);
          assert.equal(t.append(views, whole, status), records.length);
          assert.deepEqual(whole.payload(), general, `${name} row bytes from one buffer (${target.name})`);
        }
      });
    } finally {
      await store.close();
    }
  });
}

test('a transcoder declines values the column rules convert and damaged records, and writes the rest of the batch', { timeout: 60_000 }, async () => {
  const store = await targets()[0]!.open('transcode_decline');
  try {
    const ts = await transcoders(store);
    await withSerde(async (serde) => {
      const all = events();
      const turn = all.find((e) => e.name === 'TurnCompleted')!.value as EventTypes['TurnCompleted'];
      const { t: turns, codec } = ts.get('TurnCompleted')!;
      const good = serde.encode('TurnCompleted', turn);
      // Invalid UTF-8 inside the text: avsc would decode it to U+FFFD, so the bytes must not be copied as they are.
      const badUtf8 = Buffer.from(good);
      const textAt = badUtf8.indexOf(Buffer.from(turn.text, 'utf8'));
      assert.ok(textAt > 0 && turn.text.length > 0);
      badUtf8[textAt] = 0xc0;
      const declined: [Buffer, string][] = [
        // The codec writes 0 for a NaN or infinite log-prob (JSON has no NaN): the general path must do it.
        [serde.encode('TurnCompleted', { ...turn, logprobs: turn.logprobs.map((x, i) => (i === 1 ? NaN : x)) }), 'a NaN log-prob'],
        [serde.encode('TurnCompleted', { ...turn, latency_ms: Infinity }), 'an infinite latency'],
        [good.subarray(0, good.length - 3), 'a truncated record'],
        [Buffer.concat([good, Buffer.from([0])]), 'a trailing byte'],
        [badUtf8, 'invalid UTF-8'],
        [good.subarray(0, 3), 'shorter than its framing'],
      ];
      const batch = [good, ...declined.flatMap(([b]) => [b, good])];
      const out = new RowBinaryBuffer(64);
      const status = new Uint8Array(batch.length);
      assert.equal(turns.append(batch, out, status), declined.length + 1);
      declined.forEach(([, what], i) => assert.equal(status[1 + 2 * i], 0, what));
      assert.equal(status.filter((x) => x === 1).length, declined.length + 1);
      const row = generalRow(serde, codec, good);
      assert.deepEqual(out.payload(), Buffer.concat(Array.from({ length: declined.length + 1 }, () => row)), 'only the good records, each once');
      // A column without a source in the plan: no transcoder at all (the general path keeps the table right).
      assert.equal(compileTranscoder(resolvedSchema('TurnCompleted'), PLANS.TurnCompleted!, [...codec.columns, { name: 'added_later', type: 'String' }]), null);
      // A column whose type would need a conversion (a string into a number): no transcoder either.
      assert.equal(compileTranscoder(resolvedSchema('TurnCompleted'), PLANS.TurnCompleted!, codec.columns.map((c) => (c.name === 'role' ? { ...c, type: 'UInt32' } : c))), null);
    });
  } finally {
    await store.close();
  }
});
