// Rollout engines on another GPU (backend.devices, producers/policy/engine-processes.ts) over NCCL: each version
// broadcast from a trainer's model on GPU 0 into an engine process on GPU 1 gives the tokens and log-probs of the
// same weights loaded from their file by an engine here (every parameter, and the LoRA adapters alone, folded in
// from memory); an engine stopped when a version is offered is killed after the stage timeout, and the trainer's
// GPU never waits on it. Skips with a message without CUDA or with fewer than two GPUs (every
// CI machine).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { silentLogger } from '../../core/telemetry.ts';
import { ncclStatus } from '../../native/collectives/nccl-collective.ts';
import { gpusFound } from '../../native/gpus.ts';
import { Model, cudaAvailable, nativeAvailable, type ModelConfig } from '../../native/index.ts';
import { EngineProcesses } from '../../producers/policy/engine-processes.ts';
import { NativePolicyBackend } from '../../producers/policy/native-backend.ts';
import type { GenerateResult } from '../../producers/backends/types.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { TINY, maxAbsDiff } from '../native/helpers.ts';

for (const k of ['NCCL_NVLS_ENABLE', 'TORCH_SYMM_MEM_DISABLE_MULTICAST', 'NVSHMEM_DISABLE_NVLS']) process.env[k] ??= k === 'NCCL_NVLS_ENABLE' ? '0' : '1';
const skip = !nativeAvailable()
  ? 'native addon not built (npm run build:native)'
  : !cudaAvailable()
    ? 'no CUDA: addon built without RLSTREAM_CUDA=1 or no GPU present'
    : gpusFound().count < 2
      ? `needs two GPUs (${gpusFound().count} found)`
      : !ncclStatus().usable
        ? `NCCL cannot run here: ${ncclStatus().reason}`
        : false;
const CFG: ModelConfig = { ...TINY, hidden_size: 192, num_attention_heads: 3, num_key_value_heads: 1, intermediate_size: 384, vocab_size: 500, max_position_embeddings: 1024, attention_bias: true, tie_word_embeddings: false };
const configJson = JSON.stringify(CFG);
const greedy = { temperature: 0, top_p: 1, top_k: 0, max_new_tokens: 24, seed: 1, stop_token_ids: [] } as SamplingParams;
const prompts = [
  [5, 17, 99, 230, 4],
  [400, 2, 2, 71],
  [8, 9, 10, 11, 12, 13],
];

function engines(dir: string, adapters = false): Promise<EngineProcesses> {
  return EngineProcesses.start({ adapters, stageTimeoutMs: 3000, devices: [1], device: 'cuda', source: { configJson, weightsPath: join(dir, 'v0.safetensors'), version: 0 }, maxBatch: 4, maxLen: 128, gpuMemoryUtilization: 0.3, interrupt: 'next_token', weightsGroup: 'cuda', manager: { healthIntervalMs: 0 } });
}

/** What an engine in this process generates on the weights of `file` (with `adapter` folded in). */
async function reference(file: string, adapter?: string): Promise<GenerateResult[]> {
  const b = NativePolicyBackend.create({ configJson, weightsPath: file, version: 0 }, { device: 'cuda', maxBatch: 4, maxLen: 128, gpuMemoryUtilization: 0.3, interrupt: 'next_token', logger: silentLogger });
  try {
    if (adapter) await b.updatePolicy({ version: 1, weightsPath: adapter, configJson, adapter: { path: adapter, baseWeightsPath: file } });
    return await Promise.all(prompts.map((p, i) => b.generate({ requestId: `ref${i}`, promptIds: p, sampling: greedy })));
  } finally {
    await b.close();
  }
}

async function same(fleet: EngineProcesses, want: GenerateResult[], version: number, tol: number): Promise<number> {
  const got = await Promise.all(prompts.map((p, i) => fleet.generate({ requestId: `v${version}-${i}`, promptIds: p, sampling: greedy })));
  let worst = 0;
  for (const [i, g] of got.entries()) {
    assert.equal(g.server, 'cuda:1');
    assert.deepEqual(g.policyVersions, g.tokenIds.map(() => version));
    assert.deepEqual(g.tokenIds, want[i]!.tokenIds, `prompt ${i}: the greedy tokens of version ${version}'s weights`);
    worst = Math.max(worst, maxAbsDiff(g.logprobs, want[i]!.logprobs));
  }
  assert.ok(worst <= tol, `log-probs within ${tol} of the same weights loaded here (max diff ${worst})`);
  return worst;
}

/** A directory with version 0's weights, a trainer model on GPU 0 of other weights, and the fleet `run` opens. */
async function withTrainer(run: (dir: string, trainer: Model, open: (fleet: EngineProcesses) => EngineProcesses) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'rls-gpu-engines-'));
  const trainer = Model.init(CFG, { seed: 2, initStd: 0.1, device: 'cuda' });
  let fleet: EngineProcesses | null = null;
  try {
    const v0 = Model.init(CFG, { seed: 1, initStd: 0.1, device: 'cuda', trainable: false });
    await v0.save(join(dir, 'v0.safetensors'));
    v0.dispose();
    await run(dir, trainer, (f) => (fleet = f));
  } finally {
    await (fleet as EngineProcesses | null)?.close();
    trainer.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}

test('every parameter broadcast from GPU 0 into the engine on GPU 1: the tokens and log-probs of the same weights read from their file', { skip, timeout: 300_000 }, async (t) => {
  await withTrainer(async (dir, trainer, open) => {
    await trainer.save(join(dir, 'v1.safetensors'));
    const want = await reference(join(dir, 'v1.safetensors'));
    const fleet = open(await engines(dir));
    const before = await fleet.generate({ requestId: 'v0', promptIds: prompts[0]!, sampling: greedy });
    assert.notDeepEqual(before.tokenIds, want[0]!.tokenIds, 'version 0 generates other tokens (else the check below shows nothing)');
    await fleet.stageWeights(1, trainer);
    await fleet.updatePolicy({ version: 1, weightsPath: join(dir, 'not-written.safetensors'), configJson });
    t.diagnostic(`max |log-prob diff| ${(await same(fleet, want, 1, 1e-5)).toExponential(2)}`);
    assert.equal(fleet.broadcastStats().count, 1);
  });
});

test('LoRA: the adapters alone broadcast and folded in from memory give what their file folded in gives', { skip, timeout: 300_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-gpu-engines-'));
  let fleet: EngineProcesses | null = null;
  const made: Model[] = [];
  try {
    const v0 = Model.init(CFG, { seed: 1, initStd: 0.1, device: 'cuda', trainable: false });
    await v0.save(join(dir, 'v0.safetensors'));
    v0.dispose();
    // adapters with B A far from zero: drawn on the CPU, saved, and loaded into the trainer on the GPU
    const cpu = Model.load(join(dir, 'v0.safetensors'), CFG, { threads: 2, lora: { rank: 8, alpha: 16, seed: 4, targets: ['q_proj', 'v_proj', 'up_proj'] } });
    made.push(cpu);
    const { offset, numel } = cpu.trainRange();
    const block = cpu.blockView('params');
    for (let i = 0; i < numel; i++) block[offset + i] = Math.sin(i * 0.37) * 0.3;
    await cpu.saveAdapter(join(dir, 'adapter-1.safetensors'));
    const trainer = Model.load(join(dir, 'v0.safetensors'), CFG, { device: 'cuda', lora: { rank: 8, alpha: 16, seed: 4, targets: ['q_proj', 'v_proj', 'up_proj'] } });
    made.push(trainer);
    await trainer.loadAdapter(join(dir, 'adapter-1.safetensors'));
    const want = await reference(join(dir, 'v0.safetensors'), join(dir, 'adapter-1.safetensors'));
    fleet = await engines(dir, true);
    await fleet.stageWeights(1, trainer);
    const missing = join(dir, 'not-written.safetensors');
    await fleet.updatePolicy({ version: 1, weightsPath: missing, configJson, adapter: { path: missing, baseWeightsPath: join(dir, 'v0.safetensors') } });
    await same(fleet, want, 1, 1e-5);
  } finally {
    await fleet?.close();
    for (const m of made) m.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the engine stopped (SIGSTOP) when a version is offered: killed after the stage timeout, the trainer GPU never waits on it, and the next engine start works', { skip, timeout: 300_000 }, async () => {
  await withTrainer(async (dir, trainer, open) => {
    let fleet = open(await engines(dir));
    process.kill(fleet.pids[0]!, 'SIGSTOP');
    const t0 = Date.now();
    await fleet.stageWeights(1, trainer);
    assert.ok(Date.now() - t0 < 30_000);
    // the trainer's model still runs: a save reads its weights back through its stream
    await trainer.save(join(dir, 'after.safetensors'));
    await assert.rejects(fleet.generate({ requestId: 'x', promptIds: prompts[0]!, sampling: greedy }), /engine|servers/);
    await fleet.close();
    fleet = open(await engines(dir));
    await fleet.stageWeights(1, trainer);
    await fleet.updatePolicy({ version: 1, weightsPath: join(dir, 'not-written.safetensors'), configJson });
    const r = await fleet.generate({ requestId: 'y', promptIds: prompts[0]!, sampling: greedy });
    assert.ok(r.tokenIds.length > 0 && r.policyVersions.every((v) => v === 1));
  });
});
