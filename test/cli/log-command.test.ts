// `rlstream log check|repair` take a run directory as `admin --log` and `replay --log` do: its log/ is checked,
// and nothing is created in the run directory itself (opened as a log, an empty one would be made there).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { recordRun } from '../../testkit/record-run.ts';

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'rlstream.js');
const rlstream = (...args: string[]) => spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', timeout: 120_000 });

test('log check and log repair on a run directory read its log/; a directory that is neither is refused with the fix', { timeout: 240_000 }, async () => {
  const run = mkdtempSync(join(tmpdir(), 'rlstream-log-command-'));
  try {
    const log = openEmbeddedLog({ dir: join(run, 'log'), fsync: 'none' });
    const registry = await EmbeddedRegistry.open(log);
    await recordRun(log, await new EventSerde(registry).init(), { runId: 'r', groups: 2, groupSize: 2, assistantTurns: 1, trajectoriesPerStep: 4, seed: 1 });
    await registry.close();
    await log.close();
    mkdirSync(join(run, 'chdb'));
    const before = readdirSync(run).sort();

    const check = rlstream('log', 'check', run);
    assert.equal(check.status, 0, check.stdout + check.stderr);
    assert.equal(check.stdout.trim(), `rlstream log check: ${join(run, 'log')}: no damage found`);
    const repair = rlstream('log', 'repair', run);
    assert.equal(repair.status, 0, repair.stdout + repair.stderr);
    assert.equal(repair.stdout.trim(), `rlstream log repair: ${join(run, 'log')}: nothing to repair`);
    assert.deepEqual(readdirSync(run).sort(), before, 'nothing created in the run directory');

    const other = join(run, 'chdb');
    const refused = rlstream('log', 'check', other);
    assert.equal(refused.status, 1);
    assert.match(refused.stdout + refused.stderr, /log check .*chdb is neither an embedded log nor a run directory .*give the run directory/);
    assert.deepEqual(readdirSync(other), [], 'nothing created in a directory that is no log');
  } finally {
    rmSync(run, { recursive: true, force: true });
  }
});
