// The per-user npm package cache that clean clones hard-link from (infra/npm-packages.sh, run by infra/setup.sh) is
// checked file by file before a clone uses it. On a tiny project of its own (a packed local package, real `npm ci`
// offline, a temporary HOME, so the real cache is never touched): a first clone installs and fills the cache, a
// second links from it; a real `npm install` in a linked clone rewrites npm's hidden lockfile in place, which
// reached the cache through the link before, and now does not (the clone's is a copy); with that copy undone by
// hand (the first layer off), the write does reach the cache and the check catches it: the entry is discarded, npm
// ci runs and fills it again. Then damage, by hand and generated: a byte changed with the file's time put back, a
// file cut, deleted, added, replaced by a directory or a FIFO, a link retargeted, a mode changed, the checksum list
// edited or missing, the entry incomplete; each is refused, said so, and replaced by a fresh install. Last, the
// script sourced as setup.sh sources it: setup's check after npm ci (chDB's library unpacked) gates the cache.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, truncateSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { rng } from '../../core/random.ts';

const SCRIPT = resolve(import.meta.dirname, '../../infra/npm-packages.sh');

interface Fixture {
  root: string;
  env: NodeJS.ProcessEnv;
  /** The project's package.json and package-lock.json. */
  project: { pkg: string; lock: string };
  /** The cache entry directory (HOME/.cache/rlstream/node_modules/<key>), once known. */
  entry: () => string;
}

function sh(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(cmd, args, { cwd, env, encoding: 'utf8', timeout: 120_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A packed package of a few files (nested, a bin link) and a project depending on it, with its lockfile. */
function fixture(): Fixture {
  const root = mkdtempSync(join(tmpdir(), 'rlstream-npm-cache-'));
  const home = join(root, 'home');
  mkdirSync(home);
  const env: NodeJS.ProcessEnv = { ...process.env, HOME: home, RLSTREAM_INFRA_DIR: join(root, 'logs'), npm_config_offline: 'true', npm_config_update_notifier: 'false', npm_config_cache: join(home, '.npm') };
  const dep = join(root, 'dep');
  mkdirSync(join(dep, 'lib', 'deep'), { recursive: true });
  writeFileSync(join(dep, 'package.json'), JSON.stringify({ name: 'tiny-dep', version: '1.0.0', bin: { tiny: 'cli.js' } }));
  writeFileSync(join(dep, 'cli.js'), '#!/usr/bin/env node\nconsole.log(require("./index.js"));\n');
  writeFileSync(join(dep, 'index.js'), 'module.exports = "tiny " + require("./lib/deep/data.json").n;\n');
  writeFileSync(join(dep, 'lib', 'deep', 'data.json'), JSON.stringify({ n: 42, pad: 'x'.repeat(5000) }));
  for (let i = 0; i < 8; i++) writeFileSync(join(dep, 'lib', `part${i}.js`), `module.exports = ${i};\n`);
  assert.equal(sh('npm', ['pack', '--silent'], dep, env).code, 0);
  const template = join(root, 'template');
  mkdirSync(template);
  writeFileSync(join(template, 'package.json'), JSON.stringify({ name: 'proj', version: '1.0.0', dependencies: { 'tiny-dep': 'file:../dep/tiny-dep-1.0.0.tgz' } }));
  const made = sh('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error'], template, env);
  assert.equal(made.code, 0, made.stderr);
  const cacheDir = join(home, '.cache', 'rlstream', 'node_modules');
  return {
    root,
    env,
    project: { pkg: readFileSync(join(template, 'package.json'), 'utf8'), lock: readFileSync(join(template, 'package-lock.json'), 'utf8') },
    entry: () => {
      const keys = existsSync(cacheDir) ? readdirSync(cacheDir).filter((k) => /^[0-9a-f]{32}$/.test(k)) : [];
      assert.equal(keys.length, 1, `one cache entry: ${keys.join(', ')}`);
      return join(cacheDir, keys[0]!);
    },
  };
}

let clones = 0;
/** A clean clone of the project (beside dep/, as the lockfile's file: path needs), set up by the script. */
function clone(f: Fixture): { dir: string; code: number | null; stderr: string } {
  const dir = join(f.root, `clone${++clones}`);
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), f.project.pkg);
  writeFileSync(join(dir, 'package-lock.json'), f.project.lock);
  const r = sh('bash', [SCRIPT], dir, f.env);
  return { dir, code: r.code, stderr: r.stderr };
}

const manifestOf = (f: Fixture, dir: string): string => sh('bash', [SCRIPT, 'manifest', dir], f.root, f.env).stdout;

/** The clone works: the package loads, through its own files. */
function works(dir: string): void {
  const r = spawnSync(process.execPath, ['-e', 'console.log(require("tiny-dep"))'], { cwd: dir, encoding: 'utf8' });
  assert.equal(r.stdout.trim(), 'tiny 42', r.stderr);
}

/** The entry holds what a fresh install holds, and its checksum list matches it. */
function entryIsFresh(f: Fixture, pristine: string): void {
  const entry = f.entry();
  assert.ok(existsSync(join(entry, 'complete')));
  const list = readFileSync(join(entry, 'manifest'), 'utf8');
  assert.equal(manifestOf(f, join(entry, 'node_modules')), list, 'the checksum list matches the entry');
  assert.equal(list, pristine, 'the entry holds what the first install held');
}

test('a linked clone is checked against the cache entry’s checksum list; npm’s in-place write of its hidden lockfile no longer reaches the cache, and when it does the check discards the entry', { timeout: 300_000 }, () => {
  const f = fixture();
  try {
    const first = clone(f);
    assert.equal(first.code, 0, first.stderr);
    assert.match(first.stderr, /installing npm packages \(npm ci/);
    assert.match(first.stderr, /keeping a copy of the npm packages/);
    works(first.dir);
    const entry = f.entry();
    const pristine = readFileSync(join(entry, 'manifest'), 'utf8');
    assert.match(pristine, /^[0-9a-f]{64} \.\/tiny-dep\/index\.js$/m);
    assert.match(pristine, /^link \.\/\.bin\/tiny -> \.\.\/tiny-dep\/cli\.js$/m);
    assert.match(pristine, /^mode 7\d\d \.\/tiny-dep\/cli\.js$/m);
    assert.doesNotMatch(pristine, /rlstream-lock-stamp/, 'the stamp is the tree’s own');

    const second = clone(f);
    assert.equal(second.code, 0, second.stderr);
    assert.match(second.stderr, /linking the npm packages .* each file checked/);
    assert.doesNotMatch(second.stderr, /npm ci/);
    works(second.dir);
    const inode = (p: string) => statSync(p).ino;
    assert.equal(inode(join(second.dir, 'node_modules/tiny-dep/index.js')), inode(join(entry, 'node_modules/tiny-dep/index.js')), 'package files are linked');
    assert.notEqual(inode(join(second.dir, 'node_modules/.package-lock.json')), inode(join(entry, 'node_modules/.package-lock.json')), 'the hidden lockfile is a copy');

    // A real npm install in the linked clone rewrites its hidden lockfile in place: the cache is unchanged.
    const cachedLock = join(entry, 'node_modules/.package-lock.json');
    const before = readFileSync(cachedLock, 'utf8');
    writeFileSync(join(second.dir, 'package.json'), f.project.pkg.replace('"proj"', '"proj-renamed"'));
    assert.equal(sh('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error'], second.dir, f.env).code, 0);
    assert.match(readFileSync(join(second.dir, 'node_modules/.package-lock.json'), 'utf8'), /proj-renamed/, 'npm did rewrite the clone’s hidden lockfile');
    assert.equal(readFileSync(cachedLock, 'utf8'), before, 'the cache’s is unchanged');
    assert.equal(clone(f).code, 0);
    assert.equal(readFileSync(join(f.entry(), 'manifest'), 'utf8'), pristine, 'the entry is still the one filled');

    // The copy undone (linked by hand, as before the fix): the same npm write reaches the cache through the link,
    // and the next clone's check catches it, discards the entry, installs with npm ci and fills the cache again.
    const bare = join(f.root, 'linked-by-hand');
    mkdirSync(bare);
    writeFileSync(join(bare, 'package.json'), f.project.pkg.replace('"proj"', '"proj-by-hand"'));
    writeFileSync(join(bare, 'package-lock.json'), f.project.lock);
    assert.equal(sh('cp', ['-al', join(entry, 'node_modules'), join(bare, 'node_modules')], f.root, f.env).code, 0);
    assert.equal(sh('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error'], bare, f.env).code, 0);
    assert.match(readFileSync(cachedLock, 'utf8'), /proj-by-hand/, 'through the link, npm changed the cache');
    const caught = clone(f);
    assert.equal(caught.code, 0, caught.stderr);
    assert.match(caught.stderr, /failed its integrity check \(first difference, < listed, > found: [<>] [0-9a-f]{64} \.\/\.package-lock\.json\): discarded; installing with npm ci instead/);
    assert.match(caught.stderr, /installing npm packages \(npm ci/);
    assert.match(caught.stderr, /keeping a copy of the npm packages/);
    works(caught.dir);
    entryIsFresh(f, pristine);
  } finally {
    rmSync(f.root, { recursive: true, force: true });
  }
});

type Damage = (entry: string, nm: string) => string;

/** Flip one byte of `file` and put its modification time back (a check on size and time would not see it). */
function flipByte(file: string, at: number): void {
  const { atime, mtime } = statSync(file);
  const b = readFileSync(file);
  b[at % b.length] = b[at % b.length]! ^ 0x20;
  writeFileSync(file, b);
  utimesSync(file, atime, mtime);
}

const HAND: Record<string, Damage> = {
  'one byte changed, time put back': (_e, nm) => (flipByte(join(nm, 'tiny-dep/index.js'), 3), 'tiny-dep/index.js'),
  'a file cut short': (_e, nm) => (truncateSync(join(nm, 'tiny-dep/lib/deep/data.json'), 10), 'tiny-dep/lib/deep/data.json'),
  'a file emptied': (_e, nm) => (truncateSync(join(nm, 'tiny-dep/lib/part3.js'), 0), 'tiny-dep/lib/part3.js'),
  'a file deleted': (_e, nm) => (unlinkSync(join(nm, 'tiny-dep/lib/part5.js')), 'tiny-dep/lib/part5.js'),
  'a file added': (_e, nm) => (writeFileSync(join(nm, 'tiny-dep/lib/extra.js'), 'x'), 'tiny-dep/lib/extra.js'),
  'a file replaced by a directory': (_e, nm) => (unlinkSync(join(nm, 'tiny-dep/lib/part1.js')), mkdirSync(join(nm, 'tiny-dep/lib/part1.js')), 'tiny-dep/lib/part1.js'),
  'a FIFO added': (_e, nm) => (spawnSync('mkfifo', [join(nm, 'tiny-dep/fifo')]), 'tiny-dep/fifo'),
  'a bin link retargeted': (_e, nm) => (unlinkSync(join(nm, '.bin/tiny')), symlinkSync('../tiny-dep/index.js', join(nm, '.bin/tiny')), '.bin/tiny'),
  'a mode changed': (_e, nm) => (chmodSync(join(nm, 'tiny-dep/index.js'), 0o755), 'tiny-dep/index.js'),
  'the checksum list edited': (e) => (flipByte(join(e, 'manifest'), 5), ''),
  'the checksum list missing (an entry from before the check)': (e) => (unlinkSync(join(e, 'manifest')), 'no checksum list'),
  'the entry incomplete': (e) => (unlinkSync(join(e, 'complete')), 'incomplete'),
};

test('a damaged cache entry is refused, said so, discarded and replaced by a fresh install: damage by hand and generated', { timeout: 600_000 }, () => {
  const f = fixture();
  try {
    const first = clone(f);
    assert.equal(first.code, 0, first.stderr);
    const entry = f.entry();
    const pristine = readFileSync(join(entry, 'manifest'), 'utf8');
    const saved = join(f.root, 'pristine-entry');
    cpSync(entry, saved, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });
    const files = pristine.split('\n').filter((l) => /^[0-9a-f]{64} /.test(l)).map((l) => l.slice(67));
    const r = rng(2024);
    const generated: [string, Damage][] = Array.from({ length: 6 }, (_, i) => {
      const file = files[Math.floor(r() * files.length)]!;
      const at = Math.floor(r() * 10_000);
      return [`generated ${i}: a byte of ${file} flipped, time put back`, (_e: string, nm: string) => (flipByte(join(nm, file), at), file)];
    });
    const cases: [string, Damage][] = [...Object.entries(HAND), ...generated];
    for (const [what, damage] of cases) {
      rmSync(entry, { recursive: true, force: true });
      cpSync(saved, entry, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });
      const named = damage(entry, join(entry, 'node_modules'));
      const c = clone(f);
      assert.equal(c.code, 0, `${what}: ${c.stderr}`);
      assert.match(c.stderr, /failed its integrity check \(.*\): discarded; installing with npm ci instead/, what);
      assert.ok(c.stderr.includes(named), `${what}: the message names ${named}: ${c.stderr}`);
      assert.match(c.stderr, /installing npm packages \(npm ci/, what);
      works(c.dir);
      assert.ok(!existsSync(join(c.dir, 'node_modules.partial')), `${what}: no partial tree left`);
      assert.deepEqual(readdirSync(join(entry, '..')), [entry.split('/').pop()], `${what}: the discarded entry is gone, a fresh one in its place`);
      entryIsFresh(f, pristine);
    }
    process.stderr.write(`# ${cases.length} damaged cache entries refused and replaced (${Object.keys(HAND).length} by hand, ${generated.length} generated)\n`);
    // Undamaged, the restored entry links again.
    const ok = clone(f);
    assert.match(ok.stderr, /linking the npm packages/);
    assert.doesNotMatch(ok.stderr, /npm ci/);
    works(ok.dir);
  } finally {
    rmSync(f.root, { recursive: true, force: true });
  }
});

test('sourced as infra/setup.sh does: its after-install check runs after npm ci, and a failing one keeps nothing in the cache', { timeout: 300_000 }, () => {
  const f = fixture();
  try {
    const run = (check: string) => {
      const dir = join(f.root, `sourced${++clones}`);
      mkdirSync(dir);
      writeFileSync(join(dir, 'package.json'), f.project.pkg);
      writeFileSync(join(dir, 'package-lock.json'), f.project.lock);
      return { dir, ...sh('bash', ['-c', `npm_after_install() { ${check}; }; source ${JSON.stringify(SCRIPT)}; npm_packages`], dir, f.env) };
    };
    const failed = run('test -f node_modules/tiny-dep/index.js && echo "setup: checked after npm ci" >&2; exit 1');
    assert.equal(failed.code, 1);
    assert.match(failed.stderr, /installing npm packages \(npm ci[^]*checked after npm ci/);
    assert.doesNotMatch(failed.stderr, /keeping a copy/);
    assert.ok(!existsSync(join(f.env['HOME']!, '.cache', 'rlstream', 'node_modules')) || readdirSync(join(f.env['HOME']!, '.cache', 'rlstream', 'node_modules')).length === 0, 'nothing kept in the cache');
    const passed = run('echo "setup: checked after npm ci" >&2');
    assert.equal(passed.code, 0, passed.stderr);
    assert.match(passed.stderr, /checked after npm ci[^]*keeping a copy/);
    works(passed.dir);
    assert.ok(existsSync(join(f.entry(), 'manifest')));
  } finally {
    rmSync(f.root, { recursive: true, force: true });
  }
});
