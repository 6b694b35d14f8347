// Serde benchmark: µs per encode and decode, and MB/s, for every event type (trajectory events with 1,000-token
// arrays), for the baseline (avsc's toBuffer into a fresh buffer plus a header copy) and for EventSerde
// (reusable buffer, fast array codecs), in one process.
// The two sides are the harness's modes (bench/harness.ts): interleaved rounds (avsc, ours, avsc, ours, …) with a
// machine-speed probe before each, each side timing every event type in turn; a figure is the median [min–max]
// over rounds, and a speed-up is avsc / ours within each round (seconds apart, at the same load), then
// summarised the same way. One untimed pass of both sides first, so the first round's side is not the one that
// pays for the JIT. Within a round, each call's µs is the median of --repeats timed stretches of ~40 ms.
// Usage: npm run bench -- serde [--tokens 1000] [--repeats 5] [--rounds 5] [--quick]
// --quick: 2 rounds, 1 repeat of ~5 ms stretches: proves the benchmark runs, its figures mean nothing.
import { EVENT_NAMES, eventType, type EventName } from '../schemas/index.ts';
import { currentFixtureValue } from '../schemas/snapshot.ts';
import { EventSerde } from '../core/serde/events.ts';
import { MemoryRegistry } from '../core/serde/registry.ts';
import { completed, rewarded, trajectory } from '../testkit/events.ts';
import { int, parseFlags, ROUND_FLAGS } from './flags.ts';
import { fmtStats, interleaved, probeSummary, roundRatios, summarize, type Stats } from './harness.ts';

/** One value per event type; the trajectory-carrying ones and TurnCompleted with `tokens`-long arrays. */
function values(tokens: number): Map<EventName, unknown> {
  const out = new Map<EventName, unknown>(EVENT_NAMES.map((n) => [n, currentFixtureValue(n)]));
  const t = trajectory({ groupId: 'g', index: 0, tokens });
  t.response_logprobs = t.response_logprobs.map((_, i) => -((i * 7919) % 1000) / 997);
  out.set('TrajectoryCompleted', completed(t));
  const rw = rewarded(t, 1);
  out.set('RewardedTrajectory', rw);
  const adv = Array.from({ length: tokens }, (_, i) => ((i % 13) - 6) / 7);
  out.set('AdvantagedTrajectory', { ...rw, estimator: 'grpo', advantages: adv, returns: adv, group: { group_members: 8, expected_size: 8, reward_mean: 0.5, reward_std: 0.5, partial: false } });
  const turn = currentFixtureValue('TurnCompleted') as Record<string, unknown>;
  out.set('TurnCompleted', {
    ...turn,
    token_ids: Array.from({ length: tokens }, (_, i) => (i * 7919) % 151_000),
    logprobs: Array.from({ length: tokens }, (_, i) => -((i * 31) % 1000) / 997),
    response_mask: new Array<number>(tokens).fill(1),
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

/** Median µs per call over `repeats` timed stretches, each long enough (~`stretchMs`) to be measurable. */
function timeUs(fn: () => void, repeats: number, stretchMs: number): number {
  let n = 1;
  for (;;) {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) fn();
    if (performance.now() - t0 > stretchMs) break;
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

/** One side's µs per call of every event type, in one round. */
type SideTimes = Record<string, { encodeUs: number; decodeUs: number }>;

export interface SerdeRow {
  event: string;
  bytes: number;
  encodeAvscUs: Stats;
  encodeOursUs: Stats;
  /** avsc / ours within each round, then median [min–max]. */
  encodeSpeedup: Stats;
  decodeAvscUs: Stats;
  decodeOursUs: Stats;
  decodeSpeedup: Stats;
}

const FLAGS = { ...ROUND_FLAGS, tokens: int(1), repeats: int(1) };
const AVSC = 'avsc';
const OURS = 'EventSerde';

export async function main(args: string[]): Promise<unknown> {
  const { values: f } = parseFlags(args, FLAGS);
  const quick = f.quick === true;
  const tokens = f.tokens ?? 1000;
  const repeats = f.repeats ?? (quick ? 1 : 5);
  const rounds = f.rounds ?? (quick ? 2 : 5);
  const stretchMs = quick ? 5 : 40;
  const serde = await new EventSerde(new MemoryRegistry()).init();
  const cases = [...values(tokens)].map(([name, value]) => {
    const id = serde.schemaId(name);
    const ours = serde.encode(name, value as never);
    const avsc = legacyEncode(name, value, id);
    if (!ours.equals(avsc)) throw new Error(`${name}: the two encoders disagree`);
    return { name, value, id, ours, avsc };
  });
  const side = (which: typeof AVSC | typeof OURS, reps: number, ms: number): SideTimes =>
    Object.fromEntries(
      cases.map((c) => [
        c.name,
        which === AVSC
          ? { encodeUs: timeUs(() => legacyEncode(c.name, c.value, c.id), reps, ms), decodeUs: timeUs(() => legacyDecode(c.name, c.avsc), reps, ms) }
          : { encodeUs: timeUs(() => serde.encode(c.name, c.value as never), reps, ms), decodeUs: timeUs(() => serde.tryDecodeSync(c.ours), reps, ms) },
      ]),
    );
  side(AVSC, 1, 5);
  side(OURS, 1, 5);
  console.log(`serde: ${tokens}-token arrays in TurnCompleted and the trajectory events; ${rounds} interleaved rounds of ${AVSC} and ${OURS}, µs per call the median of ${repeats} stretches of ~${stretchMs} ms${quick ? ' (--quick: smoke size, figures mean nothing)' : ''}`);
  const recs = await interleaved<SideTimes>(
    [
      { name: AVSC, run: async () => side(AVSC, repeats, stretchMs) },
      { name: OURS, run: async () => side(OURS, repeats, stretchMs) },
    ],
    rounds,
  );
  const failed = recs.filter((r) => r.error);
  if (failed.length > 0) throw new Error(`serde: ${failed.map((r) => `round ${r.round + 1} ${r.mode}: ${r.error}`).join('; ')}`);
  const rows: SerdeRow[] = cases.map(({ name, ours }) => {
    const enc = summarize(recs, (t) => t[name]!.encodeUs);
    const dec = summarize(recs, (t) => t[name]!.decodeUs);
    return {
      event: name,
      bytes: ours.length,
      encodeAvscUs: enc[AVSC]!,
      encodeOursUs: enc[OURS]!,
      encodeSpeedup: roundRatios(recs, AVSC, OURS, (t) => t[name]!.encodeUs),
      decodeAvscUs: dec[AVSC]!,
      decodeOursUs: dec[OURS]!,
      decodeSpeedup: roundRatios(recs, AVSC, OURS, (t) => t[name]!.decodeUs),
    };
  });
  console.log(`\nmedian [min–max] over rounds; MB/s from the medians; speed-up = avsc / ours within a round`);
  console.log('event                   bytes │ encode µs avsc → ours (MB/s)   speed-up           │ decode µs avsc → ours (MB/s)   speed-up');
  const mbs = (bytes: number, us: number) => (bytes / us).toFixed(0).padStart(5);
  for (const r of rows) {
    const [ea, eo, da, do_] = [r.encodeAvscUs.median, r.encodeOursUs.median, r.decodeAvscUs.median, r.decodeOursUs.median];
    console.log(
      `${r.event.padEnd(21)} ${String(r.bytes).padStart(7)} │ ${ea.toFixed(1).padStart(7)} → ${eo.toFixed(1).padStart(6)} (${mbs(r.bytes, ea)} → ${mbs(r.bytes, eo)}) ${fmtStats(r.encodeSpeedup, 1, '×').padEnd(18)} │ ${da.toFixed(1).padStart(7)} → ${do_.toFixed(1).padStart(6)} (${mbs(r.bytes, da)} → ${mbs(r.bytes, do_)}) ${fmtStats(r.decodeSpeedup, 1, '×')}`,
    );
  }
  const get = (n: EventName) => rows.find((r) => r.event === n)!;
  const floors = {
    rewardTrajPerSec: Math.round(1e6 / (get('TrajectoryCompleted').decodeOursUs.median + get('RewardedTrajectory').encodeOursUs.median)),
    advantageTrajPerSec: Math.round(1e6 / (get('RewardedTrajectory').decodeOursUs.median + get('AdvantagedTrajectory').encodeOursUs.median)),
    turnCompletedEncodesPerSec: Math.round(1e6 / get('TurnCompleted').encodeOursUs.median),
  };
  console.log(`\nserde floor per consumer: reward ${floors.rewardTrajPerSec} traj/s, advantage ${floors.advantageTrajPerSec} traj/s (target 5,000); TurnCompleted encode ${floors.turnCompletedEncodesPerSec} events/s`);
  const speed = probeSummary(recs);
  console.log(`machine speed before each side: sgemm ${fmtStats(speed.sgemmGflops, 0)} GFLOP/s, JS loop ${fmtStats(speed.jsLoopMs, 0)} ms, load ${fmtStats(speed.load1m, 1)}`);
  return { options: { tokens, repeats, rounds, stretchMs, quick }, rows, floors, machineSpeed: speed, rounds: recs };
}
