// The repository stands on its own: a user's clone has nothing beside it, so no file may point outside the
// repository, and the tests that read shipped data pass from a fresh clone in an empty directory.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const ROOT = join(import.meta.dirname, '../..');
// The development machine's sibling directory `shared`, by relative path, absolute path or path segments;
// written in parts so that this file does not match itself.
const OUTSIDE = new RegExp(['\\.\\./', 'shared\\b|/work/', 'shared\\b|[\'"]\\.\\.[\'"],\\s*[\'"]', 'shared[\'"]'].join(''));

function git(args: string[], cwd = ROOT): string {
  return execFileSync('git', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

const inGit = (() => {
  try {
    return git(['rev-parse', '--is-inside-work-tree']).trim() === 'true';
  } catch {
    return false;
  }
})();
const skip = inGit ? false : 'not a git checkout: the clone check needs one';

test('no file in the repository refers to a directory beside it', { skip }, () => {
  const files = git(['ls-files', '-z', '--cached', '--others', '--exclude-standard']).split('\0').filter(Boolean);
  const hits: string[] = [];
  for (const file of files) {
    const path = join(ROOT, file);
    if (!existsSync(path)) continue; // deleted in the working tree, not yet committed
    const text = readFileSync(path);
    if (text.includes(0)) continue; // binary (weights, fixtures' bytes)
    text
      .toString('utf8')
      .split('\n')
      .forEach((line, i) => {
        if (OUTSIDE.test(line)) hits.push(`${file}:${i + 1}: ${line.trim().slice(0, 120)}`);
      });
  }
  assert.deepEqual(hits, [], 'files that read outside the repository (ship the data in the repository instead)');
});

test('the tests that read shipped data pass from a fresh clone with nothing beside it', { skip, timeout: 300_000 }, () => {
  // The clone holds what is committed: a file that is only in the working tree here would be missing there.
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-clone-'));
  try {
    const clone = join(dir, 'rlstream');
    git(['clone', '--quiet', '--no-hardlinks', ROOT, clone], dir);
    assert.deepEqual(readdirSync(dir), ['rlstream']);
    // Installed packages and the native build are not committed; the clone borrows this checkout's.
    for (const built of ['node_modules', 'native/build']) {
      if (existsSync(join(ROOT, built))) symlinkSync(join(ROOT, built), join(clone, built), 'dir');
    }
    let listed = '';
    try {
      listed = git(['grep', '-l', '-E', '-e', 'fixtures/gsm8k|gsm8kRecords|GSM8K_DIR', '--', 'test/**/*.test.ts'], clone);
    } catch {
      // git grep exits 1 when nothing matches: the assertion below says so
    }
    const dataTests = listed
      .split('\n')
      .filter((f) => f && !f.endsWith('self-contained.test.ts'));
    assert.ok(dataTests.length > 0, 'the tests that read test/fixtures/gsm8k');
    const env = { ...process.env };
    delete env['NODE_TEST_CONTEXT']; // the nested runner reports on its own, not to this one
    try {
      execFileSync(process.execPath, ['--import', 'tsx', '--test', '--test-concurrency=1', ...dataTests], { cwd: clone, env, stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (e) {
      const out = String((e as { stdout?: Buffer }).stdout ?? '') + String((e as { stderr?: Buffer }).stderr ?? '');
      assert.fail(`${dataTests.join(' ')} failed in a fresh clone:\n${out.slice(-4000)}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
