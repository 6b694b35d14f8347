// Serde benchmark: µs per encode and decode, and MB/s, for every event type (trajectory events with 1,000-token
// arrays), for the baseline (avsc's toBuffer into a fresh buffer plus a header copy) and for EventSerde
// (reusable buffer, fast array codecs), measured back to back in one process, median of repeats.
// Usage: npm run bench -- serde [--tokens 1000] [--repeats 5]
import os from 'node:os';
import { EVENT_NAMES, eventType, type EventName } from '../schemas/index.ts';
import { fixtureValue } from '../schemas/snapshot.ts';
import { EventSerde } from '../core/serde/events.ts';
import { MemoryRegistry } from '../core/serde/registry.ts';
import { completed, rewarded, trajectory } from '../testkit/events.ts';

function arg(args: string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] ? args[i + 1]! : fallback;
}

/** One value per event type; the trajectory-carrying ones and TurnCompleted with `tokens`-long arrays. */
function values(tokens: number): Map<EventName, unknown> {
  const out = new Map<EventName, unknown>(EVENT_NAMES.map((n) => [n, fixtureValue(n)]));
  const t = trajectory({ groupId: 'g', index: 0, tokens });
  t.response_logprobs = t.response_logprobs.map((_, i) => -((i * 7919) % 1000) / 997);
  out.set('TrajectoryCompleted', completed(t));
  const rw = rewarded(t, 1);
  out.set('RewardedTrajectory', rw);
  const adv = Array.from({ length: tokens }, (_, i) => ((i % 13) - 6) / 7);
  out.set('AdvantagedTrajectory', { ...rw, estimator: 'grpo', advantages: adv, returns: adv, group: { group_size: 8, expected_size: 8, reward_mean: 0.5, reward_std: 0.5, partial: false } });
  const turn = fixtureValue('TurnCompleted') as Record<string, unknown>;
  out.set('TurnCompleted', {
    ...turn,
    token_ids: Array.from({ length: tokens }, (_, i) => (i * 7919) % 151_000),
    logprobs: Array.from({ length: tokens }, (_, i) => -((i * 31) % 1000) / 997),
    loss_mask: new Array<number>(tokens).fill(1),
  });
  return out;
}

/** The previous EventSerde's encode: avsc toBuffer (which writes twice past 1 KiB), then a copy behind the header. */
function legacyEncode(name: EventName, value: unknown, id: number): Buffer {
  const body = eventType(name).toBuffer(value);
  const out = Buffer.allocUnsafe(5 + body.length);
  out.writeUInt8(0, 0);
  out.writeUInt32BE(id, 1);
  body.copy(out, 5);
  return out;
}

function legacyDecode(name: EventName, buf: Buffer): unknown {
  return eventType(name).decode(buf, 5).value;
}

/** Median µs per call over `repeats` timed rounds, each long enough (~40 ms) to be measurable. */
function timeUs(fn: () => void, repeats: number): number {
  let n = 1;
  for (;;) {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) fn();
    if (performance.now() - t0 > 40) break;
    n *= 2;
  }
  const samples: number[] = [];
  for (let r = 0; r < repeats; r++) {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) fn();
    samples.push(((performance.now() - t0) * 1000) / n);
  }
  samples.sort((a, b) => a - b);
  return samples[Math.floor(samples.length / 2)]!;
}

interface Row {
  event: string;
  bytes: number;
  encodeBeforeUs: number;
  encodeAfterUs: number;
  decodeBeforeUs: number;
  decodeAfterUs: number;
}

export async function main(args: string[]): Promise<unknown> {
  const tokens = Number(arg(args, 'tokens', '1000'));
  const repeats = Number(arg(args, 'repeats', '5'));
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const rows: Row[] = [];
  for (const [name, value] of values(tokens)) {
    const id = serde.schemaId(name);
    const after = serde.encode(name, value as never);
    const before = legacyEncode(name, value, id);
    if (!after.equals(before)) throw new Error(`${name}: the two encoders disagree`);
    // Interleaved: before, after, before, after… so a load spike hits both sides alike.
    const eb: number[] = [];
    const ea: number[] = [];
    const db: number[] = [];
    const da: number[] = [];
    for (let r = 0; r < 3; r++) {
      eb.push(timeUs(() => legacyEncode(name, value, id), repeats));
      ea.push(timeUs(() => serde.encode(name, value as never), repeats));
      db.push(timeUs(() => legacyDecode(name, before), repeats));
      da.push(timeUs(() => serde.tryDecodeSync(after), repeats));
    }
    const med = (xs: number[]) => xs.sort((a, b) => a - b)[1]!;
    rows.push({ event: name, bytes: after.length, encodeBeforeUs: med(eb), encodeAfterUs: med(ea), decodeBeforeUs: med(db), decodeAfterUs: med(da) });
  }
  const mbs = (bytes: number, us: number) => (bytes / us).toFixed(0).padStart(5);
  console.log(`serde: ${tokens}-token arrays in TurnCompleted and the trajectory events; µs per call (median), MB/s\n`);
  console.log('event                   bytes │ encode µs before → after (MB/s)       │ decode µs before → after (MB/s)');
  for (const r of rows) {
    console.log(
      `${r.event.padEnd(21)} ${String(r.bytes).padStart(7)} │ ${r.encodeBeforeUs.toFixed(1).padStart(7)} → ${r.encodeAfterUs.toFixed(1).padStart(6)} (${mbs(r.bytes, r.encodeBeforeUs)} → ${mbs(r.bytes, r.encodeAfterUs)}) ×${(r.encodeBeforeUs / r.encodeAfterUs).toFixed(1).padEnd(5)}│ ${r.decodeBeforeUs.toFixed(1).padStart(7)} → ${r.decodeAfterUs.toFixed(1).padStart(6)} (${mbs(r.bytes, r.decodeBeforeUs)} → ${mbs(r.bytes, r.decodeAfterUs)}) ×${(r.decodeBeforeUs / r.decodeAfterUs).toFixed(1)}`,
    );
  }
  const get = (n: string) => rows.find((r) => r.event === n)!;
  const reward = get('TrajectoryCompleted').decodeAfterUs + get('RewardedTrajectory').encodeAfterUs;
  const advantage = get('RewardedTrajectory').decodeAfterUs + get('AdvantagedTrajectory').encodeAfterUs;
  console.log(`\nserde floor per consumer: reward ${Math.round(1e6 / reward)} traj/s, advantage ${Math.round(1e6 / advantage)} traj/s (target 5,000); TurnCompleted encode ${Math.round(1e6 / get('TurnCompleted').encodeAfterUs)} events/s`);
  console.log(`note: ${os.cpus().length} cores, load average ${os.loadavg()[0]!.toFixed(1)}: a shared machine, timings are noisy.`);
  return { tokens, rows, note: 'shared machine; before/after interleaved in one process; medians' };
}
