// `rlstream worker <role>` on a config with the embedded log (the README's example config): the roles of the
// distributed shape meet on Kafka, and a worker alone on an embedded log would wait forever for records no other
// role can write there. It is refused at start with the fix, before anything is created.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

const REPO = join(import.meta.dirname, '..', '..');

test('worker on an embedded-log config: exit 1 naming log.kind and the two ways on; no log created', { timeout: 120_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-worker-command-'));
  try {
    const r = spawnSync(process.execPath, [join(REPO, 'bin', 'rlstream.js'), 'worker', 'reward', join(REPO, 'examples', 'calculator', 'config.yaml'), '--set', `run.data_dir=${dir}`], { encoding: 'utf8', timeout: 100_000 });
    assert.equal(r.signal, null, 'the worker exited by itself');
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, /rlstream: CONFIG_INVALID: log\.kind: embedded in .*config\.yaml: rlstream worker runs one role of the distributed shape.*set log\.kind: kafka.*rlstream run /);
    assert.equal(existsSync(join(dir, 'log')), false, 'no embedded log created');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
