// NCCL through the native core (loaded at run time): where it cannot run, every way in refuses naming what is
// missing (the library, a library that is not NCCL, the CUDA layer); where it can (NCCL, the CUDA build and a GPU),
// one rank runs each collective on fp32 and bf16 buffers through the Collective interface. The GPU machine, which
// has no Node, runs the same layer through test/gpu/nccl.sh.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { isRlstreamError } from '../../../core/errors.ts';
import { nativeAvailable } from '../../../native/index.ts';
import { NcclCollective, ncclStatus, ncclUniqueId } from '../../../consumers/trainer/parallel/nccl-collective.ts';

const ROOT = join(import.meta.dirname, '..', '..', '..');
const status = ncclStatus();

/** ncclStatus() in a fresh process with this environment (the library is loaded once per process). */
function statusWith(env: Record<string, string>): { usable: boolean; library: string | null; reason: string | null } {
  const code = `import { ncclStatus } from ${JSON.stringify(join(ROOT, 'consumers/trainer/parallel/nccl-collective.ts'))}; console.log(JSON.stringify(ncclStatus()));`;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { encoding: 'utf8', cwd: ROOT, env: { ...process.env, ...env } });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { usable: boolean; library: string | null; reason: string | null };
}

test('where NCCL cannot run, the status, the unique id and joining a group each refuse, naming what is missing', { skip: status.usable ? 'NCCL runs here (the next test uses it)' : false }, () => {
  assert.equal(status.usable, false);
  assert.ok(status.reason !== null && status.reason.length > 0);
  if (nativeAvailable() && status.library !== null) assert.match(status.reason, /dlopen\(libnccl\.so\.2\) failed|built without the CUDA layer/);
  for (const fn of [() => ncclUniqueId(), () => NcclCollective.join(new Uint8Array(128), 1, 0, 0)]) {
    assert.throws(fn, (e: unknown) => isRlstreamError(e, 'NATIVE_INVALID_ARGUMENT') && e.message === `NCCL cannot run here: ${status.reason}`);
  }
});

test('RLSTREAM_NCCL_LIBRARY pointing at a missing file or at a library that is not NCCL: refused, naming it', { skip: nativeAvailable() && status.library !== null ? false : 'the native addon with NCCL support is not built here' }, () => {
  const missing = statusWith({ RLSTREAM_NCCL_LIBRARY: '/nonexistent/libnccl.so.2' });
  assert.equal(missing.usable, false);
  assert.match(missing.reason!, /^NCCL is not loadable: dlopen\(\/nonexistent\/libnccl\.so\.2\) failed: .*No such file.*point RLSTREAM_NCCL_LIBRARY at libnccl\.so\.2$/);
  // zlib is on every machine that builds the addon (it links it): a real library, but not NCCL
  const ldconfig = spawnSync('sh', ['-c', "ldconfig -p | awk '/libz.so.1 /{print $NF; exit}'"], { encoding: 'utf8' }).stdout.trim();
  const notNccl = statusWith({ RLSTREAM_NCCL_LIBRARY: ldconfig });
  assert.equal(notNccl.usable, false);
  assert.equal(notNccl.reason, `${ldconfig} has no symbol ncclGetVersion (not NCCL, or older than 2.10)`);
});

test('one NCCL rank: each collective through the Collective interface returns its input, fp32 and bf16', { skip: status.usable ? false : `NCCL cannot run here: ${status.reason}` }, async () => {
  const c = NcclCollective.join(ncclUniqueId(), 1, 0, 0);
  try {
    const f = Float32Array.from({ length: 1003 }, (_, i) => i * 0.37 - 100);
    const b = Uint16Array.from({ length: 1003 }, (_, i) => 0x3f80 + (i % 200));
    const [f1, b1] = [f.slice(), b.slice()];
    await c.allReduce([f1, b1]);
    assert.deepEqual(f1, f);
    assert.deepEqual(b1, b);
    const out = new Float32Array(f.length);
    await c.allGather(f, out);
    assert.deepEqual(out, f);
    out.fill(0);
    await c.reduceScatter(f, out);
    assert.deepEqual(out, f);
    const g = f.slice();
    await c.broadcast(g, 0);
    assert.deepEqual(g, f);
    await assert.rejects(c.allGather(f, new Float32Array(5)), /allGather: recv has 5 elements, expected send \(1003\) x ranks \(1\)/);
  } finally {
    await c.close();
  }
});
