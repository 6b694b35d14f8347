// The control follower the rollout worker and the trainer share (core/control.ts), on the embedded log: only
// commands of its run issued no earlier than the process start less CONTROL_SLACK_MS reach the callback, in log
// order; an undecodable record is reported and skipped, and the commands after it still arrive. The expected set is
// computed here from the fields written, over generated commands around both edges and hand-written edge cases.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { CONTROL_SLACK_MS, followControl } from '../../core/control.ts';
import { openLog } from '../../core/log/open.ts';
import { rng } from '../../core/random.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { MemoryRegistry } from '../../core/serde/registry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { Control } from '../../schemas/generated/types.ts';

const RUN = 'run-ctl';

function command(i: number, runId: string, timeMs: number, command: Control['command'] = 'set_staleness'): Control {
  return { event_id: `c${i}`, time_ms: timeMs, run_id: runId, command, staleness_bound: i, reason: `case ${i}`, issued_by: null };
}

test('only this run\'s commands from this session reach the callback, in order; an undecodable record is skipped and reported', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-control-'));
  const log = await openLog({ kind: 'embedded', dir, fsync: 'none' });
  try {
    await log.createTopic({ name: TOPICS.control, partitions: 1 });
    const serde = await new EventSerde(new MemoryRegistry()).init();
    const startedMs = Date.now();
    const hand: Control[] = [
      command(0, RUN, startedMs - CONTROL_SLACK_MS - 1), // just before the slack: an earlier session's
      command(1, RUN, startedMs - CONTROL_SLACK_MS), // the slack's edge: taken
      command(2, RUN, startedMs),
      command(3, `${RUN}-other`, startedMs + 10), // another run on the same topic
      command(4, RUN.toUpperCase(), startedMs + 10), // run ids are compared exactly
      command(5, '', startedMs + 10),
      command(6, RUN, 0, 'stop'), // a stop from long ago must not end this session
    ];
    const r = rng(50);
    const runs = [RUN, `${RUN}-b`, `x${RUN}`];
    const generated = Array.from({ length: 200 }, (_, k) => command(100 + k, runs[Math.floor(r() * runs.length)]!, startedMs + Math.round((r() - 0.5) * 4 * CONTROL_SLACK_MS)));
    const all = [...hand, ...generated];
    const producer = await log.producer();
    await producer.send(TOPICS.control, all.slice(0, 100).map((c) => ({ key: c.run_id, value: serde.encode('Control', c) })));
    await producer.send(TOPICS.control, [{ key: RUN, value: Buffer.from('not an event') }]);
    await producer.send(TOPICS.control, all.slice(100).map((c) => ({ key: c.run_id, value: serde.encode('Control', c) })));
    await producer.close();
    const expected = all.filter((c) => c.run_id === RUN && c.time_ms >= startedMs - CONTROL_SLACK_MS).map((c) => c.event_id);
    assert.ok(expected.length > 20 && expected.length < all.length - 50, `the corpus exercises both sides (${expected.length} of ${all.length} apply)`);

    const got: string[] = [];
    const errors: string[] = [];
    let done!: () => void;
    const finished = new Promise<void>((resolve) => (done = resolve));
    const follower = followControl(log, serde, {
      runId: RUN,
      startedMs,
      role: 'test',
      onControl: (c) => {
        got.push(c.event_id);
        if (got.length === expected.length) done();
      },
      onError: (_err, where, record) => errors.push(`${where}@${record?.offset}`),
      poll: { maxRecords: 17, timeoutMs: 50 },
    });
    const timer = setTimeout(done, 10_000);
    await finished;
    clearTimeout(timer);
    // Anything wrongly let through would arrive within a few more polls.
    await new Promise((resolve) => setTimeout(resolve, 300));
    await follower.close();
    assert.deepEqual(got, expected);
    assert.deepEqual(errors, ['decode@100']);
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
