// Exactly-once across crashes and damage: `rlstream run` (a real process) is SIGKILLed at a random moment ten times
// and started again each time; between some lives a segment of rollout.events is truncated to half or deleted
// (the log's damage a failing disk leaves), and `rlstream log repair` is run before the next life. The finished
// run's log is then audited: no trajectory trained (or consumed) in two steps, no sample (group, sample index)
// trained twice under two ids, no (trajectory, turn_index) published twice, steps and versions contiguous. What
// each damage destroyed is measured by reading the log before and after it, record by record, and compared with
// what `rlstream log check` (before the repair) and `rlstream log repair` list (the second test); the repaired log
// then checks clean. Only the run, the check and the repair are processes of their own: start-ups are most of a
// life's time, and the clean check after the repair runs in-process (the same checkLog the command prints).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync, statSync, truncateSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { newId } from '../../core/ids.ts';
import { describeDamage } from '../../core/log/embedded/damage-report.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { checkLog } from '../../core/log/embedded/repair.ts';
import type { EventLog } from '../../core/log/types.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { readTopic } from '../../testkit/audit.ts';
import { runLife, stepsPrinted, type Kill, type Life } from '../../testkit/run-life.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const CONFIG = join(ROOT, 'examples', 'calculator', 'config.yaml');
const KILLS = 10;
// Lives train a few steps each (a resumed trainer takes what was already advantaged at once; a printed line may
// cover several steps): ten of them must leave the run unfinished for the last one. Two runs reached steps 19 and
// 23 in their first ten lives.
// Enough steps that ten lives (each killed within its first steps) never finish the run on a quiet machine, where
// a step takes a fraction of a second; the last life runs the rest.
const MAX_STEPS = 80;
const SETS = { 'trainer.max_steps': MAX_STEPS, 'trainer.groups_per_step': 2, 'rollout.n': 4, 'rollout.concurrency': 16, 'task.heldout_problems': 8, 'eval.problems': 4, 'eval.every_steps': 1000, 'advantage.group_timeout_ms': 10_000, 'traces.kind': 'none' };
/** After which lives the log is damaged, and how (those lives run at least one step, so there are rollouts to damage). */
const DAMAGE: Record<number, 'truncate' | 'delete'> = { 1: 'truncate', 3: 'delete', 5: 'truncate', 7: 'delete', 8: 'truncate' };

/** One life of `rlstream run` in `dataDir` (testkit/run-life.ts). */
const life = (dataDir: string, runIdBase: string, kill: Kill | null): Promise<Life> => runLife(CONFIG, { ...SETS, 'run.id': runIdBase, 'run.data_dir': dataDir }, kill);

function cli(...args: string[]): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'cli/main.ts'), ...args], { cwd: ROOT, encoding: 'utf8', timeout: 120_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Every record of every topic, `topic/partition/offset` → sha1 of its value, read without writing anything. */
async function snapshot(logDir: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const log = openEmbeddedLog({ dir: logDir, readOnly: true });
  try {
    for (const { name } of await log.listTopics()) {
      const ends = await log.offsets(name);
      const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
      if (target.size === 0) continue;
      const c = await log.consumer({ groupId: `snapshot-${newId()}`, topics: [name], fromBeginning: true });
      try {
        await readToEnd(c, name, target, (records) => {
          for (const r of records) out.set(`${name}/${r.partition}/${r.offset}`, createHash('sha1').update(r.value).digest('hex'));
        }, { what: 'snapshot', timeoutMs: 60_000 });
      } finally {
        await c.close();
      }
    }
  } finally {
    await log.close();
  }
  return out;
}

/** Damage one partition of rollout.events holding records: its newest non-empty segment truncated to half, or deleted. */
function damage(logDir: string, kind: 'truncate' | 'delete', before: Map<string, string>): string | null {
  const topicDir = join(logDir, 'topics', TOPICS.rolloutEvents);
  const held = readdirSync(topicDir).filter((p) => /^\d+$/.test(p) && [...before.keys()].some((k) => k.startsWith(`${TOPICS.rolloutEvents}/${p}/`)));
  if (held.length === 0) return null;
  const partition = held[Math.floor(Math.random() * held.length)]!;
  // The newest segment holding records (a segment just rolled is empty: damaging it would destroy nothing).
  const segments = readdirSync(join(topicDir, partition)).filter((f) => f.endsWith('.log')).sort().map((f) => join(topicDir, partition, f));
  const file = segments.filter((f) => statSync(f).size > 0).pop();
  if (file === undefined) return null;
  const size = statSync(file).size;
  if (kind === 'truncate') truncateSync(file, Math.floor(size / 2));
  else unlinkSync(file);
  return `${kind} ${TOPICS.rolloutEvents}/${partition} ${file.slice(logDir.length + 1)} (${size} bytes)`;
}

/** The gaps `rlstream log check`/`repair` list: `  topic/partition offsets a..b (n records): why` or `a..end: why`. */
function listedGaps(stdout: string): { tp: string; from: number; to: number }[] {
  return [...stdout.matchAll(/^\s+(\S+\/\d+) offsets (\d+)\.\.(\d+|end)(?: \(\d+ records?\))?:/gm)].map((m) => ({ tp: m[1]!, from: Number(m[2]), to: m[3] === 'end' ? Infinity : Number(m[3]) }));
}

interface DamageDone {
  after: number;
  what: string;
  /** Records of the log before the damage that are gone or changed after the repair, `topic/partition/offset`. */
  lost: string[];
  checkBefore: { code: number | null; stdout: string };
  repair: string;
  /** What a check of the repaired log finds that fails it (`describeDamage(...).problems`), and its lines. */
  problemsAfter: number;
  linesAfter: string[];
}

const damages: DamageDone[] = [];

test('rlstream run SIGKILLed ten times, its log damaged and repaired between lives: no trajectory trained twice, no turn published twice', { timeout: 900_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-eo-'));
  try {
    const runIdBase = `eo${process.pid}`;
    let runDir: string | null = null;
    let last: Life | null = null;
    let killed = 0;
    for (let i = 0; i <= KILLS; i++) {
      // Kills land anywhere from start-up (evaluation, first rollouts) to a life's third step, at a random moment of
      // the step under way.
      const afterSteps = DAMAGE[i] !== undefined ? 1 + Math.floor(Math.random() * 2) : Math.floor(Math.random() * 3);
      const kill = i < KILLS ? { afterSteps, delayMs: Math.round(Math.random() * 1000) } : null;
      const t0 = performance.now();
      const l = await life(dir, runIdBase, kill);
      process.stderr.write(`# life ${i}: ${kill === null ? 'to the end' : `SIGKILL ${kill.delayMs} ms after ${kill.afterSteps} step(s) of its own`}, ${l.signal ?? `exit ${l.code}`} after ${((performance.now() - t0) / 1000).toFixed(1)} s, steps it printed ${stepsPrinted(l.stderr).join(',') || 'none'}\n`);
      const runs = readdirSync(dir);
      assert.equal(runs.length, 1, `one run directory: ${runs.join(', ')}; life ${i}: ${l.stderr.slice(-2000)}`);
      runDir = join(dir, runs[0]!);
      if (l.signal === null) {
        // Finished (before its kill landed, or the last life): nothing more to resume.
        assert.equal(l.code, 0, l.stderr.slice(-3000));
        last = l;
        break;
      }
      killed++;
      const kind = DAMAGE[i];
      if (kind === undefined) continue;
      const logDir = join(runDir, 'log');
      const d0 = performance.now();
      const before = await snapshot(logDir);
      const what = damage(logDir, kind, before);
      if (what === null) {
        process.stderr.write(`# damage after life ${i}: rollout.events holds nothing yet; none done\n`);
        continue;
      }
      const checkBefore = cli('log', 'check', runDir);
      const repair = cli('log', 'repair', runDir);
      assert.equal(repair.code, 0, `log repair after ${what}: ${repair.stdout}${repair.stderr}`);
      const checkAfter = describeDamage(await checkLog(logDir), 'check');
      const after = await snapshot(logDir);
      const lost = [...before].filter(([k, h]) => after.get(k) !== h).map(([k]) => k);
      damages.push({ after: i, what, lost, checkBefore, repair: repair.stdout.trim(), problemsAfter: checkAfter.problems, linesAfter: checkAfter.lines });
      process.stderr.write(`# damage after life ${i}: ${what}; ${lost.length} records lost; check before repair exit ${checkBefore.code}, ${listedGaps(checkBefore.stdout).length} gap(s) listed; repair listed ${listedGaps(repair.stdout).length}; after it ${checkAfter.problems} problem(s); ${((performance.now() - d0) / 1000).toFixed(1)} s\n`);
    }
    assert.ok(last !== null && runDir !== null, 'the run finished');
    assert.equal(killed, KILLS, `every life but the last was SIGKILLed before the run finished`);
    assert.ok(damages.length >= 3, `the log was damaged ${damages.length} times`);
    const summary = JSON.parse(last.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
    assert.equal(summary['steps'], MAX_STEPS);
    const runId = summary['run_id'] as string;

    const log: EventLog = openEmbeddedLog({ dir: join(runDir, 'log') });
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    try {
      // Which sample (group, index) each trajectory is, from the advantaged topic the trainer reads.
      const sampleOf = new Map<string, string>();
      await readTopic(log, TOPICS.advantaged, async (v) => {
        const ev = await serde.decode(v);
        if (ev.name === 'AdvantagedTrajectory' && ev.value.trajectory.run_id === runId) sampleOf.set(ev.value.trajectory.trajectory_id, `${ev.value.trajectory.group_id}/${ev.value.trajectory.sample_index}`);
      });
      const trained = new Map<string, number[]>();
      const consumed = new Map<string, number[]>();
      const steps: number[] = [];
      let skipped = 0;
      await readTopic(log, TOPICS.trainSteps, async (v) => {
        const ev = await serde.decode(v);
        if (ev.name !== 'TrainStep' || ev.value.run_id !== runId) return;
        const s = ev.value;
        steps.push(s.step);
        skipped += s.metrics.find((m) => m.name === 'skipped_already_consumed')?.value ?? 0;
        for (const id of s.trajectory_ids) trained.set(id, [...(trained.get(id) ?? []), s.step]);
        for (const id of [...s.trajectory_ids, ...s.dropped_trajectory_ids]) consumed.set(id, [...(consumed.get(id) ?? []), s.step]);
      });
      assert.deepEqual(steps, Array.from({ length: MAX_STEPS }, (_, i) => i + 1), 'steps 1..max_steps, each once, in order');
      const twice = [...trained].filter(([, s]) => s.length > 1);
      const some = (xs: unknown[]) => `${xs.length}, e.g. ${JSON.stringify(xs.slice(0, 4))}`;
      assert.equal(twice.length, 0, `trajectories trained in two steps (id, steps): ${some(twice)}`);
      const consumedTwice = [...consumed].filter(([, s]) => s.length > 1);
      assert.equal(consumedTwice.length, 0, `trajectories consumed (trained or dropped) in two steps: ${some(consumedTwice)}`);
      const bySample = new Map<string, string[]>();
      for (const id of trained.keys()) {
        const sample = sampleOf.get(id);
        assert.ok(sample !== undefined, `trained trajectory ${id} is on the advantaged topic`);
        bySample.set(sample, [...(bySample.get(sample) ?? []), id]);
      }
      const sampleTwice = [...bySample].filter(([, ids]) => ids.length > 1);
      assert.equal(sampleTwice.length, 0, `samples (group/index) trained under two trajectory ids: ${some(sampleTwice)}`);
      process.stderr.write(`# exactly-once: ${steps.length} steps, ${trained.size} trajectories trained once each (${bySample.size} samples), ${consumed.size} consumed (trained or dropped), ${skipped} records skipped as already consumed\n`);

      // Turns: one version of each (trajectory, turn_index), and one record per event id.
      const turns = new Map<string, number>();
      const eventIds = new Map<string, number>();
      let turnRecords = 0;
      await readTopic(log, TOPICS.rolloutEvents, async (v) => {
        const ev = await serde.decode(v);
        if (ev.name !== 'TurnCompleted' || ev.value.run_id !== runId) return;
        turnRecords++;
        const k = `${ev.value.trajectory_id}/${ev.value.turn_index}`;
        turns.set(k, (turns.get(k) ?? 0) + 1);
        eventIds.set(ev.value.event_id, (eventIds.get(ev.value.event_id) ?? 0) + 1);
      });
      assert.ok(turnRecords > 0);
      const turnTwice = [...turns].filter(([, n]) => n > 1);
      assert.equal(turnTwice.length, 0, `(trajectory, turn_index) published more than once: ${some(turnTwice)}`);
      const idTwice = [...eventIds].filter(([, n]) => n > 1);
      assert.equal(idTwice.length, 0, `turn event ids in more than one record: ${some(idTwice)}`);
      process.stderr.write(`# turns: ${turnRecords} records, ${turns.size} distinct (trajectory, turn_index); ${damages.length} damages\n`);
    } finally {
      await serde.registry.close();
      await log.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// Every record a damage destroyed is in a gap `rlstream log check` lists before the repair (which exits 1), and in
// one `rlstream log repair` lists; the repaired log then checks clean.
test('every record the damage destroyed is listed by rlstream log check', () => {
  assert.ok(damages.length > 0, 'the first test damaged the log');
  const unlisted: string[] = [];
  const unlistedBy = (d: DamageDone, who: string, stdout: string) => {
    const gaps = listedGaps(stdout);
    const missed = d.lost.filter((k) => {
      const [topic, partition, offset] = k.split('/');
      return !gaps.some((g) => g.tp === `${topic}/${partition}` && Number(offset) >= g.from && Number(offset) <= g.to);
    });
    if (missed.length > 0) unlisted.push(`${d.what}: ${missed.length} of ${d.lost.length} lost records unlisted by ${who} (e.g. ${missed.slice(0, 3).join(', ')}); it said: ${stdout.trim()}`);
  };
  for (const d of damages) {
    assert.ok(d.lost.length > 0, `${d.what} destroyed records`);
    if (d.checkBefore.code !== 1) unlisted.push(`${d.what}: log check before the repair exited ${d.checkBefore.code}: ${d.checkBefore.stdout.trim().split('\n')[0]}`);
    unlistedBy(d, 'log check', d.checkBefore.stdout);
    unlistedBy(d, 'log repair', d.repair);
    if (d.problemsAfter !== 0) unlisted.push(`${d.what}: the repaired log still fails its check: ${d.linesAfter.join(' | ')}`);
  }
  assert.deepEqual(unlisted, []);
});
