// The damage of an embedded log as the commands show it: `rlstream replay` over a log with a flipped byte
// replays every intact record and warns on stderr; over a log missing a segment it exits non-zero naming the
// file and `rlstream log repair`; `rlstream log check` reports both without writing and `rlstream log repair` makes
// the log readable again, listing what was lost, after which a check passes, listing the ranges it accepted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { recordRun } from '../../testkit/record-run.ts';

const CLI = join(import.meta.dirname, '../../cli/main.ts');

function rlstream(...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, stdout, stderr })));
}

/** Records read by a replay of the rollout topic into a log copy (the job's final JSON line). */
function replayed(stdout: string): number {
  const last = stdout.trim().split('\n').pop()!;
  return (JSON.parse(last) as { read: number }).read;
}

test('replay and log check/repair over a damaged embedded log report the damage; nothing intact is lost', { timeout: 240_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-log-cli-'));
  const logDir = join(dir, 'log');
  try {
    const log = openEmbeddedLog({ dir: logDir, fsync: 'none' });
    const registry = await EmbeddedRegistry.open(log);
    const serde = await new EventSerde(registry).init();
    await recordRun(log, serde, { runId: 'r', groups: 6, groupSize: 2, assistantTurns: 2, trajectoriesPerStep: 4, seed: 3 });
    const total = (await log.offsets(TOPICS.rolloutEvents)).reduce((n, o) => n + o.high, 0);
    const high1 = (await log.offsets(TOPICS.rolloutEvents))[1]!.high;
    await registry.close();
    await log.close();
    const args = (n: number) => ['replay', '--log', logDir, '--topics', TOPICS.rolloutEvents, '--into', `log:${join(dir, `copy-${n}`)}`];

    const clean = await rlstream(...args(0));
    assert.equal(clean.code, 0, clean.stderr);
    assert.equal(replayed(clean.stdout), total);

    // One flipped byte in the middle of partition 0: one record lost, every other one replayed, and said so.
    const p0 = join(logDir, 'topics', TOPICS.rolloutEvents, '0');
    const seg = join(p0, readdirSync(p0).find((f) => f.endsWith('.log'))!);
    const bytes = readFileSync(seg);
    bytes[Math.floor(bytes.length / 2)]! ^= 0x22;
    writeFileSync(seg, bytes);
    // Replay opens the log read-only: it reads around the damage, says so, and leaves the file as it is.
    const damaged = await rlstream(...args(1));
    assert.equal(damaged.code, 0, damaged.stderr);
    assert.equal(replayed(damaged.stdout), total - 1);
    assert.match(damaged.stderr, /damaged records found \(left in place: read-only open\)/);
    assert.match(damaged.stderr, /reader skipped offsets lost to damage/);
    assert.ok(readFileSync(seg).equals(bytes), 'the replay wrote nothing into the log');

    const check = await rlstream('log', 'check', logDir);
    assert.equal(check.code, 1);
    assert.match(check.stdout, new RegExp(`1 range\\(s\\) of records lost and not repaired \\(1 record\\):\\n  ${TOPICS.rolloutEvents}/0 offsets (\\d+)\\.\\.\\1 \\(1 record\\): `));

    // A segment file deleted: a writer's open refuses, naming it and the repair (here: a replay that writes into
    // the log); check reports it without writing.
    const p1 = join(logDir, 'topics', TOPICS.rolloutEvents, '1');
    const gone = join(p1, readdirSync(p1).find((f) => f.endsWith('.log'))!);
    unlinkSync(gone);
    const refused = await rlstream('replay', '--log', logDir, '--topics', TOPICS.rolloutEvents, '--into', 'topic:copy');
    assert.notEqual(refused.code, 0);
    assert.match(refused.stderr, new RegExp(`LOG_CORRUPT: [^]*${gone.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: segment file missing[^]*of ${TOPICS.rolloutEvents}/1 are lost[^]*rlstream log repair ${logDir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
    const checkGone = await rlstream('log', 'check', logDir);
    assert.equal(checkGone.code, 1);
    // Partition 0's record was quarantined and listed by that open (accepted); partition 1's segment is a new loss.
    const gone1 = `${TOPICS.rolloutEvents}/1 offsets 0\\.\\.${high1 - 1} \\(${high1} records\\): segment file missing`;
    assert.match(checkGone.stdout, new RegExp(`1 range\\(s\\) of records lost and not repaired \\(${high1} records\\):\\n  ${gone1}[^]*1 range\\(s\\) lost earlier and accepted[^]*\\n  ${TOPICS.rolloutEvents}/0 offsets`));

    const repair = await rlstream('log', 'repair', logDir);
    assert.equal(repair.code, 0, repair.stderr);
    // The writer's open that refused had already quarantined partition 0's damaged record (recorded, so safe):
    // repair has the missing segment left.
    assert.match(repair.stdout, new RegExp(`1 range\\(s\\) of records lost \\(${high1} records\\), now listed in the partitions' damage.json and skipped by readers:\\n  ${gone1}`));
    const after = await rlstream(...args(3));
    assert.equal(after.code, 0, after.stderr);
    // Repaired: the check passes, listing both ranges as accepted.
    const lost = await rlstream('log', 'check', logDir);
    assert.equal(lost.code, 0, lost.stdout);
    assert.match(lost.stdout, /no damage found\n2 range\(s\) lost earlier and accepted/);
    assert.equal(replayed(after.stdout), total - 1 - high1);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
