// The end-of-run audit of the fault tests: every started trajectory is in the trainer's consumed set
// (TrainStep.trajectory_ids plus dropped_trajectory_ids) exactly once, or accounted for as aborted, dead-lettered
// or superseded (cut short by a crash, its sample run again under a new id by the restarted worker); no sample is
// consumed under two ids; steps and policy versions are contiguous and unique; ClickHouse holds no duplicate.
import { newId } from '../core/ids.ts';
import type { EventLog } from '../core/log/types.ts';
import { readToEnd } from '../core/log/read-to-end.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { TOPICS } from '../core/topics.ts';
import type { DecodedEvent } from '../core/serde/events.ts';

export interface DeadLetterInfo {
  consumer: string;
  sourceTopic: string;
  errorCode: string;
  error: string;
  /** The trajectory id of the dead-lettered record, when its bytes decode to one. */
  trajectoryId: string | null;
}

export interface RunRecords {
  started: Map<string, number>;
  /** The sample (group_id/sample_index) each started trajectory is. */
  sampleOf: Map<string, string>;
  completed: Map<string, number>;
  aborted: Set<string>;
  /** Times each trajectory id appears in a committed TrainStep (trained or dropped as stale). */
  consumed: Map<string, number>;
  steps: number[];
  versions: number[];
  deadLetters: DeadLetterInfo[];
  undecodable: number;
  /** Trajectory ids on the rewarded and advantaged topics (how far each got, for diagnosis). */
  rewarded: Map<string, number>;
  advantaged: Map<string, number>;
}

/** Every committed record of a topic (read_committed), to its end at the time of the call. */
export async function readTopic(log: EventLog, topic: string, each: (value: Buffer) => Promise<void>): Promise<void> {
  const ends = await log.offsets(topic);
  const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
  if (target.size === 0) return;
  const consumer = await log.consumer({ groupId: `audit-${newId()}`, topics: [topic], readCommitted: true, fromBeginning: true });
  try {
    // By position, so "at the end" is exact, not a guess (see readToEnd).
    await readToEnd(consumer, topic, target, async (records) => {
      for (const r of records) await each(r.value);
    }, { what: 'audit', timeoutMs: 60_000 });
  } finally {
    await consumer.close();
  }
}

async function tryDecode(serde: EventSerde, value: Buffer): Promise<DecodedEvent | null> {
  try {
    return serde.tryDecodeSync(value) ?? (await serde.decode(value));
  } catch {
    return null;
  }
}

const bump = (m: Map<string, number>, k: string) => m.set(k, (m.get(k) ?? 0) + 1);

/**
 * Distinct samples (group_id/sample_index) of the run's started training trajectories: a sample cut short by a
 * crash runs again under a new trajectory id, and is consumed once under one of them.
 */
export async function collectStarted(log: EventLog, serde: EventSerde, runId: string): Promise<Set<string>> {
  const samples = new Set<string>();
  await readTopic(log, TOPICS.rolloutEvents, async (v) => {
    if (v.length >= 5 && v[0] === 0 && v.readUInt32BE(1) !== serde.schemaId('TrajectoryStarted')) return;
    const ev = await tryDecode(serde, v);
    if (ev?.name === 'TrajectoryStarted' && ev.value.run_id === runId && ev.value.dataset.split === 'train') samples.add(`${ev.value.group_id}/${ev.value.sample_index}`);
  });
  return samples;
}

export async function collectRun(log: EventLog, serde: EventSerde, runId: string): Promise<RunRecords> {
  const out: RunRecords = { started: new Map(), sampleOf: new Map(), completed: new Map(), aborted: new Set(), consumed: new Map(), steps: [], versions: [], deadLetters: [], undecodable: 0, rewarded: new Map(), advantaged: new Map() };
  await readTopic(log, TOPICS.rolloutEvents, async (v) => {
    const ev = await tryDecode(serde, v);
    if (!ev) return void out.undecodable++;
    if (ev.name === 'TrajectoryStarted' && ev.value.run_id === runId && ev.value.dataset.split === 'train') {
      bump(out.started, ev.value.trajectory_id);
      out.sampleOf.set(ev.value.trajectory_id, `${ev.value.group_id}/${ev.value.sample_index}`);
    }
    if (ev.name === 'TrajectoryCompleted' && ev.value.trajectory.run_id === runId && ev.value.trajectory.dataset.split === 'train') {
      bump(out.completed, ev.value.trajectory.trajectory_id);
      if (ev.value.trajectory.termination === 'aborted') out.aborted.add(ev.value.trajectory.trajectory_id);
    }
  });
  for (const [topic, into] of [[TOPICS.rewarded, out.rewarded], [TOPICS.advantaged, out.advantaged]] as const) {
    await readTopic(log, topic, async (v) => {
      const ev = await tryDecode(serde, v);
      const t = (ev?.value as { trajectory?: { run_id: string; trajectory_id: string } } | undefined)?.trajectory;
      if (t && t.run_id === runId) bump(into, t.trajectory_id);
    });
  }
  await readTopic(log, TOPICS.trainSteps, async (v) => {
    const ev = await tryDecode(serde, v);
    if (ev?.name !== 'TrainStep' || ev.value.run_id !== runId) return;
    out.steps.push(ev.value.step);
    for (const id of [...ev.value.trajectory_ids, ...ev.value.dropped_trajectory_ids]) bump(out.consumed, id);
  });
  await readTopic(log, TOPICS.policyVersions, async (v) => {
    const ev = await tryDecode(serde, v);
    if (ev?.name === 'PolicyVersion' && ev.value.run_id === runId) out.versions.push(ev.value.policy_version);
  });
  await readTopic(log, TOPICS.deadLetter, async (v) => {
    const ev = await tryDecode(serde, v);
    if (ev?.name !== 'DeadLetter') return;
    const inner = await tryDecode(serde, ev.value.value);
    const iv = inner?.value as { trajectory?: { trajectory_id: string }; trajectory_id?: string } | undefined;
    out.deadLetters.push({
      consumer: ev.value.consumer,
      sourceTopic: ev.value.source_topic,
      errorCode: ev.value.error_code,
      error: ev.value.error,
      trajectoryId: iv?.trajectory?.trajectory_id ?? iv?.trajectory_id ?? null,
    });
  });
  return out;
}

/** Diagnosis of trajectories stuck before the advantage consumer: their records on `rewarded`, its committed offsets and checkpoints. */
/** Where records of the given trajectories sit on a topic: `id/group@partition:offset`, committed or not. */
async function positionsOf(log: EventLog, serde: EventSerde, topic: string, want: Set<string>, readCommitted: boolean): Promise<string[]> {
  const at: string[] = [];
  const consumer = await log.consumer({ groupId: `audit-${newId()}`, topics: [topic], readCommitted, fromBeginning: true });
  let idle = 0;
  while (idle < 8) {
    const batch = await consumer.poll({ maxRecords: 2000, timeoutMs: 300 });
    idle = batch.length === 0 ? idle + 1 : 0;
    for (const r of batch) {
      const ev = await tryDecode(serde, r.value);
      const t = (ev?.value as { trajectory?: { trajectory_id: string; group_id: string } } | undefined)?.trajectory;
      if (t && want.has(t.trajectory_id)) at.push(`${ev!.name}:${t.trajectory_id.slice(0, 6)}/${t.group_id.slice(0, 6)}@${r.partition}:${r.offset}`);
    }
  }
  await consumer.close();
  return at;
}

/**
 * For trajectories stuck before a stage (`reward`: completed but not rewarded; `advantage`: rewarded but not
 * advantaged): where their input records are, any outputs of theirs including those of aborted transactions,
 * the stage's committed offsets and its last checkpoints.
 */
export async function stuckDetail(log: EventLog, serde: EventSerde, runId: string, stage: 'reward' | 'advantage', ids: string[]): Promise<string> {
  if (ids.length === 0) return '';
  const want = new Set(ids);
  const [input, output] = stage === 'reward' ? [TOPICS.rolloutEvents, TOPICS.rewarded] : [TOPICS.rewarded, TOPICS.advantaged];
  const inputs = await positionsOf(log, serde, input, want, true);
  const outputs = await positionsOf(log, serde, output, want, false);
  const committed = await log.committed(`${runId}.${stage}`, input);
  const state: string[] = [];
  if (stage === 'advantage') await readTopic(log, `_state.${runId}.advantage`, async (v) => void state.push(v.toString()));
  return `${stage}: inputs ${inputs.join(' ')}; outputs, aborted included ${outputs.join(' ') || 'none'}; committed ${JSON.stringify(committed)}${state.length > 0 ? `; last checkpoints ${state.slice(-6).join(' ')}` : ''}`;
}

/** Where the trajectories that did not reach the trainer stopped. */
export function stuck(r: RunRecords): Record<string, string[]> {
  const out: Record<string, string[]> = { notCompleted: [], notRewarded: [], notAdvantaged: [], notConsumed: [] };
  const rerun = new Set([...r.completed.keys()].map((id) => r.sampleOf.get(id)));
  for (const id of r.started.keys()) {
    if (!r.completed.has(id) && rerun.has(r.sampleOf.get(id))) continue; // superseded: cut short, its sample rerun
    if (!r.completed.has(id)) out['notCompleted']!.push(id);
    else if (!r.rewarded.has(id)) out['notRewarded']!.push(id);
    else if (!r.advantaged.has(id)) out['notAdvantaged']!.push(id);
    else if (!r.consumed.has(id)) out['notConsumed']!.push(id);
  }
  return out;
}

export interface AuditResult {
  /** Samples (group_id/sample_index) started: one per trajectory the dataset asked for, however often it ran. */
  started: number;
  consumedOnce: number;
  aborted: number;
  deadLettered: number;
  /** Started trajectories cut short by a crash whose sample completed under the id of its rerun. */
  superseded: number;
  /** Violations, empty when the run is exact. */
  problems: string[];
}

/** Trajectory ids in committed TrainSteps of the run (trained or dropped as stale), with repeats. */
export async function consumedIds(log: EventLog, serde: EventSerde, runId: string): Promise<string[]> {
  const ids: string[] = [];
  await readTopic(log, TOPICS.trainSteps, async (v) => {
    const ev = await tryDecode(serde, v);
    if (ev?.name === 'TrainStep' && ev.value.run_id === runId) ids.push(...ev.value.trajectory_ids, ...ev.value.dropped_trajectory_ids);
  });
  return ids;
}

/** Samples (group_id/sample_index) consumed, each with the trajectory ids it was consumed under. */
function consumedSamples(r: RunRecords): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const id of r.consumed.keys()) {
    const sample = r.sampleOf.get(id);
    if (sample !== undefined) out.set(sample, [...(out.get(sample) ?? []), id]);
  }
  return out;
}

/** Check the exactly-once accounting: steps must be 1..N once each, versions 0..N once each (publish_every 1). */
export function auditRun(r: RunRecords): AuditResult {
  const maxSteps = r.steps.length;
  const problems: string[] = [];
  const dead = new Set(r.deadLetters.map((d) => d.trajectoryId).filter((x): x is string => x !== null));
  let once = 0;
  let aborted = 0;
  let deadLettered = 0;
  let superseded = 0;
  const samples = consumedSamples(r);
  for (const [sample, ids] of samples) if (ids.length > 1) problems.push(`sample ${sample} consumed under ${ids.length} trajectory ids (${ids.join(', ')})`);
  // Samples that completed under some id: an attempt of theirs that never completed was cut short and rerun.
  const rerun = new Set([...r.completed.keys()].map((id) => r.sampleOf.get(id)).filter((x): x is string => x !== undefined));
  const missing: string[] = [];
  for (const id of r.started.keys()) {
    const n = r.consumed.get(id) ?? 0;
    if (n === 1) once++;
    else if (n > 1) problems.push(`trajectory ${id} consumed ${n} times`);
    else if (r.aborted.has(id)) aborted++;
    else if (dead.has(id)) deadLettered++;
    else if (!r.completed.has(id) && rerun.has(r.sampleOf.get(id)!)) superseded++;
    else missing.push(id);
  }
  if (missing.length > 0) problems.push(`${missing.length} started trajectories neither consumed, aborted, dead-lettered nor superseded (e.g. ${missing.slice(0, 3).join(', ')})`);
  for (const id of r.consumed.keys()) if (!r.started.has(id)) problems.push(`trajectory ${id} consumed but never started`);
  const steps = [...r.steps].sort((a, b) => a - b);
  const wantSteps = Array.from({ length: maxSteps }, (_, i) => i + 1);
  if (JSON.stringify(steps) !== JSON.stringify(wantSteps)) problems.push(`train steps are not 1..${maxSteps} once each: ${JSON.stringify(steps)}`);
  const versions = [...r.versions].sort((a, b) => a - b);
  const wantVersions = Array.from({ length: maxSteps + 1 }, (_, i) => i);
  if (versions.length === 0 || JSON.stringify(versions) !== JSON.stringify(wantVersions)) problems.push(`policy versions are not contiguous from 0, once each: ${JSON.stringify(versions)}`);
  return { started: new Set(r.sampleOf.values()).size, consumedOnce: once, aborted, deadLettered, superseded, problems };
}

/** A query on the ClickHouse server over HTTP; rows as objects. */
export async function clickhouse(url: string, database: string, sql: string): Promise<Record<string, unknown>[]> {
  const res = await fetch(`${url}/?database=${encodeURIComponent(database)}`, { method: 'POST', body: `${sql} FORMAT JSON` });
  const text = await res.text();
  if (!res.ok) throw new Error(`ClickHouse: ${text.slice(0, 500)}`);
  return (JSON.parse(text) as { data: Record<string, unknown>[] }).data;
}

/** Drop a run's database (the server keeps its data directory between test runs). */
export async function dropDatabase(url: string, database: string): Promise<void> {
  const res = await fetch(url, { method: 'POST', body: `DROP DATABASE IF EXISTS ${database}` });
  if (!res.ok) throw new Error(`ClickHouse: ${(await res.text()).slice(0, 500)}`);
}

/**
 * Duplicates in the trace tables of a run: rows per identity after FINAL must equal distinct identities and
 * distinct event ids. Returns the per-table counts and problems (raw rows above distinct are replays the
 * ReplacingMergeTree collapses; they are reported, not errors).
 */
export async function traceDuplicates(url: string, database: string, runId: string): Promise<{ tables: Record<string, { raw: number; final: number; keys: number; eventIds: number }>; problems: string[] }> {
  const tables: Record<string, string> = {
    trajectory_starts: 'trajectory_id',
    trajectories: 'trajectory_id',
    train_steps: 'toString(step)',
    policy_versions: 'toString(version)',
  };
  const out: Record<string, { raw: number; final: number; keys: number; eventIds: number }> = {};
  const problems: string[] = [];
  const run = runId.replace(/'/g, '');
  for (const [table, key] of Object.entries(tables)) {
    const [a] = await clickhouse(url, database, `SELECT count() AS raw, uniqExact(${key}) AS keys, uniqExact(event_id) AS ids FROM ${table} WHERE run_id = '${run}'`);
    const [b] = await clickhouse(url, database, `SELECT count() AS final FROM ${table} FINAL WHERE run_id = '${run}'`);
    const t = { raw: Number(a!['raw']), final: Number(b!['final']), keys: Number(a!['keys']), eventIds: Number(a!['ids']) };
    out[table] = t;
    if (t.final !== t.keys) problems.push(`${table}: ${t.final} rows after FINAL for ${t.keys} distinct keys`);
    if (t.eventIds !== t.keys) problems.push(`${table}: ${t.eventIds} distinct event ids for ${t.keys} distinct keys`);
  }
  return { tables: out, problems };
}
