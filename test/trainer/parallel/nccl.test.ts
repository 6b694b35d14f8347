// NCCL through the native core (loaded at run time): where it cannot run, every way in refuses naming what is
// missing (the library, a library that is not NCCL, the CUDA layer); where it can (NCCL, the CUDA build and a GPU),
// one rank runs each collective on fp32 and bf16 buffers through the Collective interface, and over a GPU model's
// own blocks, in a data-parallel step. The GPU machine runs this file through test/gpu/pack-node.sh test, and the
// native layer alone through test/gpu/nccl.sh.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { isRlstreamError } from '../../../core/errors.ts';
import { cudaAvailable, Model, nativeAvailable } from '../../../native/index.ts';
import { packMicroBatches } from '../../../consumers/trainer/batch.ts';
import { compileTrainerOptions } from '../../../consumers/trainer/options.ts';
import { NcclCollective, ncclStatus, ncclUniqueId } from '../../../native/collectives/nccl-collective.ts';
import { DataParallelRank } from '../../../consumers/trainer/parallel/rank-step.ts';
import { TINY_CONFIG } from '../fixtures/synthetic.ts';
import { flat, randomGroups, singleProcess } from './dp-fixtures.ts';

const ROOT = join(import.meta.dirname, '..', '..', '..');
const status = ncclStatus();

/** ncclStatus() in a fresh process with this environment (the library is loaded once per process). */
function statusWith(env: Record<string, string>): { usable: boolean; library: string | null; reason: string | null } {
  const code = `import { ncclStatus } from ${JSON.stringify(join(ROOT, 'native/collectives/nccl-collective.ts'))}; console.log(JSON.stringify(ncclStatus()));`;
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

const gpu = status.usable && cudaAvailable() ? false : `NCCL or a GPU is missing here: ${status.reason ?? 'no CUDA GPU'}`;

test("one NCCL rank over a GPU model: the block collectives leave its blocks as they were, and a data-parallel step on the device is the single-process step to the last bits of the embedding's atomics", { skip: gpu }, async () => {
  const c = NcclCollective.join(ncclUniqueId(), 1, 0, 0);
  const init = { seed: 3, threads: 1, device: 'cuda' as const };
  const m = Model.init(TINY_CONFIG, init);
  const ref = Model.init(TINY_CONFIG, init);
  try {
    const before = flat(m.parameters());
    const n = m.numParameters;
    await c.allReduceBlock(m, 'params', 0, n);
    await c.broadcastBlock(m, 'params', 5, 100, 0);
    await c.allGatherBlock(m, 'params', 7, 50);
    m.paramsWritten(0, n);
    assert.deepEqual(flat(m.parameters()), before);
    // the step: one rank, fp32 buckets of an odd size, the model's own AdamW (sharded over one rank: all of it)
    const options = compileTrainerOptions({ max_tokens_per_micro_batch: 48, grad_clip: 1, learning_rate: 1e-3, weight_decay: 0.01 });
    const samples = randomGroups(5, 11).flatMap((g) => g.samples);
    const rank = new DataParallelRank(m, c, options, { bucketBytes: 4 * 13, dtype: 'fp32' });
    await rank.step(samples, 0);
    const want = await singleProcess(ref, [packMicroBatches(samples, options.maxTokensPerMicroBatch)], options, 0);
    // Not bit for bit on the device: the CUDA embedding backward adds repeated token ids with atomics (native/cuda/
    // elementwise.cu, the GPU path's one non-deterministic sum), so two runs of the same step differ in the last bits
    // of those rows, and through the clip's norm in a few others. Measured on an H200 (2026-11-30): 238 of 10,336
    // gradients off by at most 7.5e-9. On the CPU the step is bit for bit (data-parallel-step.test.ts).
    const grads = flat(m.gradients());
    const gradScale = Math.max(...want.firstGrads.map(Math.abs));
    assert.ok(maxAbsDiff(grads, want.firstGrads) <= 1e-6 * gradScale, `gradients within 1e-6 of their largest (${gradScale}): ${maxAbsDiff(grads, want.firstGrads)}`);
    assert.ok(maxAbsDiff(flat(m.parameters()), want.params) <= 1e-6, `weights within 1e-6: ${maxAbsDiff(flat(m.parameters()), want.params)}`);
    assert.notDeepEqual(want.params, before, 'the step moved the weights');
    // a range outside the block is refused before NCCL runs (and, like any failure, ends this communicator)
    await assert.rejects(c.allReduceBlock(m, 'grads', 0, m.trainRange().numel + 1), /must lie inside the grads block/);
  } finally {
    m.dispose();
    ref.dispose();
    await c.close();
  }
});

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!));
  return worst;
}
