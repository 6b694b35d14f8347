// The built-in policy on the native core (producers/policy/native-backend.ts, NativeEngine.swap): a new policy
// version written into the model in place, under rollout.interrupt next_token (the turn goes on with the new
// weights, its context prefilled again) and next_turn (the turn finishes on the old ones first); the config's
// device: cuda where CUDA is absent; a version handed over from a trainer's model in the same process (stageWeights,
// Model.copyParamsFrom) instead of its file. Runs on the CPU device (the class takes the device; the config's path
// is cuda only).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { jsonLogger, silentLogger } from '../../core/telemetry.ts';
import { Model, cudaAvailable, nativeAvailable, type ModelConfig } from '../../native/index.ts';
import { ADAPTER_SWAPS_PER_BASE_READ, NativePolicyBackend } from '../../producers/policy/native-backend.ts';
import { NativeEngine } from '../../producers/policy/native-engine.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { TINY, maxAbsDiff, pack } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const CFG: ModelConfig = { ...TINY, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 48, vocab_size: 61, max_position_embeddings: 128 };
const sampling = (o: Partial<SamplingParams> = {}) => ({ temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 30, seed: 3, stop_token_ids: [], ...o }) as SamplingParams;

async function forwardLogprobs(m: Model, prompt: number[], out: number[]): Promise<number[]> {
  const { batch, targets } = pack([[...prompt, ...out]]);
  const { logprobs } = await m.forward(batch, targets);
  return Array.from(logprobs.slice(prompt.length - 1, prompt.length - 1 + out.length));
}

/** Resolves once the engine has run `n` steps. */
async function afterSteps(engine: NativeEngine, n: number): Promise<void> {
  while (engine.stats().steps < n) await new Promise((r) => setImmediate(r));
}

test("next_token: a turn under way goes on with the new weights in place, each token carrying its version's log-prob", { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-native-swap-'));
  try {
    const v1 = Model.init(CFG, { seed: 2, threads: 2, initStd: 0.3 });
    await v1.save(join(dir, 'v1.safetensors'));
    const v0 = Model.init(CFG, { seed: 1, threads: 2, initStd: 0.3 });
    const m = Model.init(CFG, { seed: 1, threads: 2, initStd: 0.3 });
    const engine = new NativeEngine(m, { slots: 2, maxLen: 64 });
    const prompt = [1, 2, 3, 4, 5, 6];
    const turn = engine.generate({ requestId: 'a', sessionId: 's', promptIds: prompt, sampling: sampling() });
    await afterSteps(engine, 8);
    await engine.swap(1, () => m.loadWeights(join(dir, 'v1.safetensors')), 'next_token');
    const r = await turn;
    const k = r.policyVersions.indexOf(1);
    assert.ok(k >= 8 && k < 30, `the swap landed mid-turn (first v1 token at ${k})`);
    assert.ok(r.policyVersions.slice(k).every((v) => v === 1) && r.policyVersions.slice(0, k).every((v) => v === 0));
    const old = await forwardLogprobs(v0, prompt, r.tokenIds);
    const neu = await forwardLogprobs(v1, prompt, r.tokenIds);
    assert.ok(maxAbsDiff(r.logprobs.slice(0, k), old.slice(0, k)) < 1e-5, 'tokens before the swap: the old weights');
    assert.ok(maxAbsDiff(r.logprobs.slice(k), neu.slice(k)) < 1e-5, 'tokens after it: the new weights on the whole context');
    assert.equal(engine.currentPolicyVersion(), 1);
    engine.close();
    for (const x of [m, v0, v1]) x.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('next_turn: the turn under way finishes on the old weights, the next turn of its session starts fresh on the new', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-native-swap-'));
  try {
    const v1 = Model.init(CFG, { seed: 2, threads: 2, initStd: 0.3 });
    await v1.save(join(dir, 'v1.safetensors'));
    const v0 = Model.init(CFG, { seed: 1, threads: 2, initStd: 0.3 });
    await v0.save(join(dir, 'v0.safetensors'));
    const backend = NativePolicyBackend.create({ configJson: JSON.stringify(CFG), weightsPath: join(dir, 'v0.safetensors'), version: 0 }, { device: 'cpu', maxBatch: 2, maxLen: 96, gpuMemoryUtilization: 0.5, interrupt: 'next_turn', logger: silentLogger });
    const prompt = [7, 8, 9];
    const turn = backend.generate({ requestId: 'a', sessionId: 's', promptIds: prompt, sampling: sampling() });
    await afterSteps((backend as unknown as { engine: NativeEngine }).engine, 5);
    const update = backend.updatePolicy({ version: 1, weightsPath: join(dir, 'v1.safetensors'), configJson: JSON.stringify(CFG) });
    const r = await turn;
    await update;
    assert.ok(r.policyVersions.every((v) => v === 0), 'the whole turn on v0');
    assert.ok(maxAbsDiff(r.logprobs, await forwardLogprobs(v0, prompt, r.tokenIds)) < 1e-5);
    const ctx = [...prompt, ...r.tokenIds, 11, 12];
    const before = backend.stats().reusedTokens;
    const r2 = await backend.generate({ requestId: 'b', sessionId: 's', promptIds: ctx, sampling: sampling({ max_new_tokens: 5 }) });
    assert.equal(backend.stats().reusedTokens, before, "the session's v0 cache is not reused on v1");
    assert.deepEqual(r2.policyVersions, [1, 1, 1, 1, 1]);
    assert.ok(maxAbsDiff(r2.logprobs, await forwardLogprobs(v1, ctx, r2.tokenIds)) < 1e-5);
    await assert.rejects(backend.updatePolicy({ version: 2, weightsPath: join(dir, 'v1.safetensors'), configJson: JSON.stringify({ ...CFG, hidden_size: 64 }) }), /changes the model architecture/);
    assert.throws(
      () => NativePolicyBackend.create({ configJson: JSON.stringify(CFG), weightsPath: join(dir, 'v0.safetensors'), version: 0 }, { device: 'cpu', maxBatch: 1, gpuMemoryUtilization: 0.5, interrupt: 'finish' }),
      /supports next_turn and next_token, not finish/,
    );
    await backend.close();
    v0.dispose();
    v1.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('Model.copyParamsFrom: the weights of another model of the same shapes, refused while it runs or when shapes differ', { skip }, async () => {
  const src = Model.init(CFG, { seed: 4, threads: 2, initStd: 0.3 });
  const dst = Model.init(CFG, { seed: 5, threads: 2, initStd: 0.3 });
  const prompt = [3, 1, 4, 1, 5];
  const out = [9, 2, 6, 5, 3, 5];
  const want = await forwardLogprobs(src, prompt, out);
  assert.ok(maxAbsDiff(await forwardLogprobs(dst, prompt, out), want) > 1e-3, 'the two models differ before the copy');
  dst.copyParamsFrom(src);
  assert.ok(maxAbsDiff(await forwardLogprobs(dst, prompt, out), want) < 1e-6, 'equal after it');
  const running = src.forward(pack([[...prompt, ...out]]).batch, pack([[...prompt, ...out]]).targets);
  assert.throws(() => dst.copyParamsFrom(src), /copyParamsFrom: forward is still running on the source model/);
  await running;
  const other = Model.init({ ...CFG, intermediate_size: 64 }, { seed: 1, threads: 2 });
  assert.throws(() => dst.copyParamsFrom(other), /copyParamsFrom: the source model has other shapes/);
  for (const m of [src, dst, other]) m.dispose();
});

test("stageWeights: a trainer's model in this process hands a version over device to device; an older version reads its file", { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-native-stage-'));
  try {
    const v0 = Model.init(CFG, { seed: 1, threads: 2, initStd: 0.3 });
    await v0.save(join(dir, 'v0.safetensors'));
    const trainer = Model.init(CFG, { seed: 2, threads: 2, initStd: 0.3 });
    const lines: string[] = [];
    const backend = NativePolicyBackend.create({ configJson: JSON.stringify(CFG), weightsPath: join(dir, 'v0.safetensors'), version: 0 }, { device: 'cpu', maxBatch: 2, maxLen: 96, gpuMemoryUtilization: 0.5, interrupt: 'next_turn', logger: jsonLogger({ write: (l) => lines.push(l) }) });
    // Where each version's weights came from, as the hot-swap log line says.
    const sources = () => lines.map((l) => JSON.parse(l) as { msg: string; version: number; from?: string }).filter((l) => l.msg === 'policy hot-swapped in place').map((l) => `${l.version}:${l.from}`);
    const prompt = [7, 8, 9];
    const config = JSON.stringify(CFG);
    // Version 1 staged from the trainer's model: its update needs no file (the path does not exist).
    backend.stageWeights(1, trainer);
    await backend.updatePolicy({ version: 1, weightsPath: join(dir, 'missing-v1.safetensors'), configJson: config });
    const r1 = await backend.generate({ requestId: 'a', promptIds: prompt, sampling: sampling({ max_new_tokens: 8 }) });
    assert.deepEqual(r1.policyVersions, Array(8).fill(1));
    assert.ok(maxAbsDiff(r1.logprobs, await forwardLogprobs(trainer, prompt, r1.tokenIds)) < 1e-5, "generated with the trainer's weights");
    assert.deepEqual(sources(), ['1:trainer']);
    // The trainer moves on (version 3 staged) before version 2's update arrives: 2 comes from its file.
    const v2 = Model.init(CFG, { seed: 3, threads: 2, initStd: 0.3 });
    await v2.save(join(dir, 'v2.safetensors'));
    const v3 = Model.init(CFG, { seed: 6, threads: 2, initStd: 0.3 });
    backend.stageWeights(3, v3);
    await backend.updatePolicy({ version: 2, weightsPath: join(dir, 'v2.safetensors'), configJson: config });
    const r2 = await backend.generate({ requestId: 'b', promptIds: prompt, sampling: sampling({ max_new_tokens: 8 }) });
    assert.ok(maxAbsDiff(r2.logprobs, await forwardLogprobs(v2, prompt, r2.tokenIds)) < 1e-5, "version 2's weights, from its file");
    assert.deepEqual(sources(), ['1:trainer', '2:file']);
    await backend.updatePolicy({ version: 3, weightsPath: join(dir, 'missing-v3.safetensors'), configJson: config });
    const r3 = await backend.generate({ requestId: 'c', promptIds: prompt, sampling: sampling({ max_new_tokens: 8 }) });
    assert.ok(maxAbsDiff(r3.logprobs, await forwardLogprobs(v3, prompt, r3.tokenIds)) < 1e-5);
    assert.deepEqual(sources(), ['1:trainer', '2:file', '3:trainer']);
    // A trainer's model of other shapes is not staged (the trainer's step must not fail on it): its file is read.
    const wide = Model.init({ ...CFG, intermediate_size: 64 }, { seed: 1, threads: 2 });
    assert.doesNotThrow(() => backend.stageWeights(4, wide));
    await v2.save(join(dir, 'v4.safetensors'));
    await backend.updatePolicy({ version: 4, weightsPath: join(dir, 'v4.safetensors'), configJson: config });
    assert.deepEqual(sources(), ['1:trainer', '2:file', '3:trainer', '4:file']);
    assert.ok(lines.some((l) => l.includes('cannot be staged on the device')), 'the unstageable model is logged');
    // The seconds the main job's JSON line reports (rl.backend_seconds): three generations and two file loads took some.
    const spent = backend.deviceSeconds();
    assert.ok(spent.generate > 0 && spent.loadWeights > 0, JSON.stringify(spent));
    wide.dispose();
    await backend.close();
    for (const m of [v0, trainer, v2, v3]) m.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('adapter versions: swapped on the device (the folded adapter out, the new one in), the base read again every ADAPTER_SWAPS_PER_BASE_READ swaps and when the folded adapter is gone; each version generates what its base plus its adapter computes', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-native-adapter-'));
  try {
    const base = Model.init(CFG, { seed: 1, threads: 2, initStd: 0.3 });
    const basePath = join(dir, 'base.safetensors');
    await base.save(basePath);
    // adapters with random B (a fresh one has B = 0, which folds in as nothing)
    const lora = { rank: 4, alpha: 8, targets: ['q_proj', 'v_proj', 'gate_proj', 'down_proj'] as const };
    const adapterFile = async (v: number): Promise<string> => {
      const m = Model.init(CFG, { seed: 1, threads: 2, initStd: 0.3, lora: { ...lora, targets: [...lora.targets], seed: v } });
      let x = v * 7919;
      for (const [n, t] of m.adapter()) if (n.includes('lora_B')) for (let i = 0; i < t.data.length; i++) t.data[i] = (((x = (x * 48271) % 2147483647) / 2147483647) - 0.5) * 0.8;
      const path = join(dir, `v${v}.adapter.safetensors`);
      await m.saveAdapter(path);
      m.dispose();
      return path;
    };
    const lines: string[] = [];
    const backend = NativePolicyBackend.create({ configJson: JSON.stringify(CFG), weightsPath: basePath, version: 0 }, { device: 'cpu', maxBatch: 2, maxLen: 96, gpuMemoryUtilization: 0.5, interrupt: 'next_turn', logger: jsonLogger({ write: (l) => lines.push(l) }) });
    const sources = () => lines.map((l) => JSON.parse(l) as { msg: string; version: number; from?: string }).filter((l) => l.msg === 'policy hot-swapped in place').map((l) => `${l.version}:${l.from}`);
    const prompt = [7, 8, 9, 10];
    const config = JSON.stringify(CFG);
    const reference = Model.load(basePath, CFG, { threads: 2, trainable: false });
    const versions = ADAPTER_SWAPS_PER_BASE_READ + 3;
    let worst = 0;
    for (let v = 1; v <= versions; v++) {
      const path = await adapterFile(v);
      if (v === versions) rmSync(join(dir, `v${v - 1}.adapter.safetensors`)); // the folded adapter's file is gone
      await backend.updatePolicy({ version: v, weightsPath: path, configJson: config, adapter: { path, baseWeightsPath: basePath } });
      const r = await backend.generate({ requestId: `r${v}`, promptIds: prompt, sampling: sampling({ max_new_tokens: 6 }) });
      assert.deepEqual(r.policyVersions, Array(6).fill(v));
      await reference.loadWeights(basePath);
      await reference.mergeAdapter(path);
      const d = maxAbsDiff(r.logprobs, await forwardLogprobs(reference, prompt, r.tokenIds));
      worst = Math.max(worst, d);
      assert.ok(d < 1e-4, `version ${v}: log-probs differ from base + its adapter by ${d}`);
    }
    // the engine starts on the base with nothing folded in, so v1 is a swap too; swaps up to the bound, then the
    // base read again, a swap, and a read where the folded adapter's file was deleted

    const want = Array.from({ length: versions }, (_, i) => {
      const v = i + 1;
      const from = v === versions || v === ADAPTER_SWAPS_PER_BASE_READ + 1 ? 'file' : 'adapter';
      return `${v}:${from}`;
    });
    assert.deepEqual(sources(), want);
    assert.ok(lines.some((l) => l.includes('the folded adapter cannot be taken out')), 'the missing adapter is logged');
    await backend.close();
    for (const m of [base, reference]) m.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('backend device: cuda without CUDA stops with the field and both fixes named', { skip: nativeAvailable() && !cudaAvailable() ? false : 'CUDA is available here (or the addon is not built)' }, async () => {
  // imported here, where it runs: the registry loads typebox, which the GPU machine's pack (test/gpu/pack-node.sh)
  // does not carry, and there CUDA is available and this test skipped
  const { backends } = await import('../../producers/backends/registry.ts');
  const plugin = backends.get('builtin');
  await assert.rejects(
    plugin.create({ max_batch: 4, threads: 1, workers: 1, kv_cache_bytes: 0, device: 'cuda' }, { configJson: JSON.stringify(CFG), initWeights: '/nonexistent', tokenizerDir: '', baseDir: '.', interrupt: 'next_turn', logger: silentLogger }),
    /backend\.device: cuda needs the native addon built with RLSTREAM_CUDA=1 .* or set backend\.device: cpu/,
  );
});
