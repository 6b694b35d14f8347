// `rlstream replay` as a real process on real files: it never destroys or mixes data unasked. An existing
// --into jsonl: file is refused (--force replaces it), the SFT export takes the training problems only unless
// --split says otherwise and says what it left out, a log copy into a log that holds records needs --append and,
// when those records are another run's, --other-run too; a copy into its own source is always refused; an
// existing topic needs --append; a flag for another target is refused, not ignored.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { recordRun, type Recorded } from '../../testkit/record-run.ts';

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'rlstream.js');
let dir: string;
let runA: Recorded;

async function record(logDir: string, runId: string): Promise<Recorded> {
  const log = openEmbeddedLog({ dir: logDir, fsync: 'none' });
  const registry = await EmbeddedRegistry.open(log);
  try {
    return await recordRun(log, await new EventSerde(registry).init(), { runId, groups: 20, groupSize: 4, assistantTurns: 2, trajectoriesPerStep: 16, seed: 3 });
  } finally {
    await registry.close();
    await log.close();
  }
}

/** Records in a log's event topics (every topic but the internal `_…` ones). */
async function records(logDir: string): Promise<number> {
  const log: EventLog = openEmbeddedLog({ dir: logDir, fsync: 'none' });
  try {
    let n = 0;
    for (const t of await log.listTopics()) if (!t.name.startsWith('_')) for (const p of await log.offsets(t.name)) n += p.high - p.low;
    return n;
  } finally {
    await log.close();
  }
}

function replay(...args: string[]) {
  const r = spawnSync(process.execPath, [BIN, 'replay', ...args], { encoding: 'utf8', timeout: 120_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr, summary: r.status === 0 ? (JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, unknown>) : null };
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-replay-cli-'));
  runA = await record(join(dir, 'a', 'log'), 'run-a');
  await record(join(dir, 'b', 'log'), 'run-b');
});

after(() => rmSync(dir, { recursive: true, force: true }));

/** The group number of an exported conversation (the synthetic prompt names it); every 10th group is held out. */
const groupOf = (line: string) => Number(/What is (\d+) mod 97/.exec(line)![1]);

test('SFT export: training problems only by default, --split heldout / all, and the summary says how many it left out', () => {
  const successful = (split: string) =>
    runA.events.filter((e) => e.name === 'RewardedTrajectory' && (e.value as { reward: { correct: boolean }; trajectory: { dataset: { split: string } } }).reward.correct && (e.value as { trajectory: { dataset: { split: string } } }).trajectory.dataset.split === split).length;
  assert.ok(successful('heldout') > 0 && successful('train') > 0, 'the recording has successful trajectories of both splits');
  const out = (name: string) => join(dir, name);
  const train = replay('--log', join(dir, 'a'), '--into', `jsonl:${out('train.jsonl')}`);
  assert.equal(train.code, 0, train.stderr);
  const lines = readFileSync(out('train.jsonl'), 'utf8').trim().split('\n');
  assert.ok(lines.length > 0 && lines.every((l) => groupOf(l) % 10 !== 9), 'no held-out problem in the default export');
  assert.equal((train.summary!['skipped'] as Record<string, number>)['other_split'], successful('heldout'));
  assert.deepEqual(train.summary!['skipped_splits'], { heldout: successful('heldout') });
  assert.match(train.stderr, new RegExp(`left out ${successful('heldout')} of split heldout: the export takes --split train only`));

  const heldout = replay('--log', join(dir, 'a'), '--into', `jsonl:${out('heldout.jsonl')}`, '--split', 'heldout');
  assert.equal(heldout.code, 0, heldout.stderr);
  const held = readFileSync(out('heldout.jsonl'), 'utf8').trim().split('\n');
  assert.ok(held.every((l) => groupOf(l) % 10 === 9));
  const all = replay('--log', join(dir, 'a'), '--into', `jsonl:${out('all.jsonl')}`, '--split', 'all');
  assert.equal(all.code, 0, all.stderr);
  assert.equal(readFileSync(out('all.jsonl'), 'utf8').trim().split('\n').length, lines.length + held.length);
  assert.equal((all.summary!['skipped'] as Record<string, number>)['other_split'], 0);
  assert.doesNotMatch(all.stderr, /left out/);

  const bad = replay('--log', join(dir, 'a'), '--into', `jsonl:${out('x.jsonl')}`, '--split', 'test');
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /--split must be train, heldout or all, got "test"/);
});

test('--into jsonl: an existing file is refused naming --force, and replaced with it', () => {
  const file = join(dir, 'existing.jsonl');
  writeFileSync(file, 'precious\n');
  const refused = replay('--log', join(dir, 'a'), '--into', `jsonl:${file}`);
  assert.notEqual(refused.code, 0);
  assert.match(refused.stderr, /--into jsonl: .*existing\.jsonl exists; --force replaces it/);
  assert.equal(readFileSync(file, 'utf8'), 'precious\n');
  const forced = replay('--log', join(dir, 'a'), '--into', `jsonl:${file}`, '--force');
  assert.equal(forced.code, 0, forced.stderr);
  assert.match(readFileSync(file, 'utf8'), /"messages"/);
  // A file inside the source log (a segment, even through a link) is refused whatever the flags.
  symlinkSync(join(dir, 'a', 'log'), join(dir, 'log-link'));
  for (const inside of [join(dir, 'a', 'log', 'export.jsonl'), join(dir, 'log-link', 'export.jsonl')]) {
    const r = replay('--log', join(dir, 'a'), '--into', `jsonl:${inside}`, '--force');
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /lies inside the source log .*writing it would damage the log/);
  }
  const misplaced = replay('--log', join(dir, 'a'), '--into', `log:${join(dir, 'copy-x')}`, '--force');
  assert.notEqual(misplaced.code, 0);
  assert.match(misplaced.stderr, /--force applies to --into jsonl:, not log:/);
});

test("--into log: refuses its own source always, a log holding records without --append, another run's without --other-run", async () => {
  const before = await records(join(dir, 'b', 'log'));
  const own = replay('--log', join(dir, 'a'), '--into', `log:${join(dir, 'a', 'log')}`, '--append', '--other-run');
  assert.notEqual(own.code, 0);
  assert.match(own.stderr, /is the source log .*a copy into itself would double every record/);
  const viaRunDir = replay('--log', join(dir, 'a', 'log'), '--into', `log:${join(dir, 'a')}`, '--append');
  assert.match(viaRunDir.stderr, /is the source log/);
  const nested = replay('--log', join(dir, 'a'), '--into', `log:${join(dir, 'a', 'log', 'copy')}`);
  assert.match(nested.stderr, /lie one inside the other/);

  const plain = replay('--log', join(dir, 'a'), '--into', `log:${join(dir, 'b', 'log')}`);
  assert.notEqual(plain.code, 0);
  assert.match(plain.stderr, new RegExp(`already holds ${before} records of run run-b; --append adds the copy to them`));
  const append = replay('--log', join(dir, 'a'), '--into', `log:${join(dir, 'b')}`, '--append');
  assert.notEqual(append.code, 0);
  assert.match(append.stderr, /belongs to run run-b, the source .* to run run-a: adding it would mix two runs in one log; --other-run \(with --append\) adds it anyway/);
  assert.equal(await records(join(dir, 'b', 'log')), before, 'nothing was added to run-b');

  const mixed = replay('--log', join(dir, 'a'), '--into', `log:${join(dir, 'b', 'log')}`, '--append', '--other-run');
  assert.equal(mixed.code, 0, mixed.stderr);
  assert.equal(await records(join(dir, 'b', 'log')), before + runA.sent);
});

test('--into log: a new log takes the copy; again only with --append (the same run); an empty directory is new', async () => {
  const fresh = join(dir, 'copy');
  const first = replay('--log', join(dir, 'a'), '--into', `log:${fresh}`);
  assert.equal(first.code, 0, first.stderr);
  assert.equal(await records(fresh), runA.sent);
  const again = replay('--log', join(dir, 'a'), '--into', `log:${fresh}`);
  assert.notEqual(again.code, 0);
  assert.match(again.stderr, /already holds \d+ records of run run-a; --append/);
  const appended = replay('--log', join(dir, 'a'), '--into', `log:${fresh}`, '--append');
  assert.equal(appended.code, 0, appended.stderr);
  assert.equal(await records(fresh), 2 * runA.sent);
  const empty = join(dir, 'empty');
  mkdirSync(empty);
  assert.equal(replay('--log', join(dir, 'a'), '--into', `log:${empty}`).code, 0);
  const notALog = join(dir, 'stuff');
  mkdirSync(notALog);
  writeFileSync(join(notALog, 'notes.txt'), 'mine\n');
  const refused = replay('--log', join(dir, 'a'), '--into', `log:${notALog}`);
  assert.notEqual(refused.code, 0);
  assert.match(refused.stderr, /--into log: .*stuff is neither an embedded log nor a run directory/);
  assert.equal(readFileSync(join(notALog, 'notes.txt'), 'utf8'), 'mine\n');
});

test('--into topic: an existing topic that holds records needs --append; --reward is refused for other targets', () => {
  const first = replay('--log', join(dir, 'a'), '--into', 'topic:rewarded.again', '--reward', 'math_numeric', '--topics', 'rollout.events');
  assert.equal(first.code, 0, first.stderr);
  const again = replay('--log', join(dir, 'a'), '--into', 'topic:rewarded.again', '--reward', 'math_numeric', '--topics', 'rollout.events');
  assert.notEqual(again.code, 0);
  assert.match(again.stderr, /--into topic:rewarded\.again already holds \d+ records; --append adds to them/);
  assert.equal(replay('--log', join(dir, 'a'), '--into', 'topic:rewarded.again', '--reward', 'math_numeric', '--topics', 'rollout.events', '--append').code, 0);
  const misplaced = replay('--log', join(dir, 'a'), '--into', `jsonl:${join(dir, 'r.jsonl')}`, '--reward', 'math_numeric');
  assert.match(misplaced.stderr, /--reward applies to --into topic:, not jsonl:/);
});

test('a cancelled or failed SFT export leaves no file: part of the data would pass for all of it', async () => {
  const { ReplayJob } = await import('../../consumers/replay/job.ts');
  const { JsonlTarget } = await import('../../consumers/replay/targets.ts');
  const log = openEmbeddedLog({ dir: join(dir, 'a', 'log'), fsync: 'none' });
  const registry = await EmbeddedRegistry.open(log);
  try {
    const serde = await new EventSerde(registry).init();
    const file = join(dir, 'cancelled.jsonl');
    const job = ReplayJob.start({ log, serde, target: new JsonlTarget(file) });
    job.cancel();
    assert.equal((await job.done).state, 'cancelled');
    assert.equal(existsSync(file), false);
    const done = await ReplayJob.start({ log, serde, target: new JsonlTarget(file) }).done;
    assert.equal(done.state, 'done');
    assert.ok(existsSync(file));
    assert.deepEqual(readdirSync(dir).filter((f) => f.includes('.tmp')), [], 'no temporary file left');
  } finally {
    await registry.close();
    await log.close();
  }
});
