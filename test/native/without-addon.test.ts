// The JS paths that stand in for the native addon where it is not built, run for real: the embedded log's tests
// (frame checks and sealing in JS), the trace sink's (every record through the general path) and the binary
// inserts' (chDB reads RowBinary files instead of Native blocks), in a process started with RLSTREAM_NATIVE=off,
// since an addon once loaded cannot be unloaded from a process.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';

const FILES = ['test/log/embedded-crc.test.ts', 'test/log/embedded.test.ts', 'test/log/embedded-durability.test.ts', 'test/traces/sink.test.ts', 'test/traces/rowbinary.test.ts'];

test('without the addon, the embedded log and the trace sink pass their tests on the JS paths', { timeout: 600_000 }, () => {
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-concurrency=1', '--test-reporter=tap', ...FILES], {
    // NODE_TEST_CONTEXT would make the child report to this runner instead of printing its own summary.
    env: { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== 'NODE_TEST_CONTEXT')), RLSTREAM_NATIVE: 'off' },
    encoding: 'utf8',
    maxBuffer: 64 << 20,
  });
  const out = `${r.stdout}\n${r.stderr}`;
  const count = (name: string) => Number(new RegExp(`^# ${name} (\\d+)`, 'm').exec(r.stdout)?.[1] ?? NaN);
  assert.equal(r.status, 0, `child failed:\n${out.slice(-4000)}`);
  assert.equal(count('fail'), 0);
  assert.ok(count('pass') >= 30, `only ${count('pass')} tests passed`); // 34 when written
  // The native-only comparison is the one skip, and it says why (besides server tests where none is running).
  const noServer = (r.stdout.match(/# SKIP CLICKHOUSE_URL is not set/g) ?? []).length;
  assert.equal(count('skipped'), 1 + noServer);
  assert.match(r.stdout, /# SKIP the native addon is not built \(or RLSTREAM_NATIVE=off\)/);
});
