// A policy version reaching a rollout engine on another GPU (backend.devices, issue #53): broadcast from a trainer's
// model on GPU 0 over NCCL into the engine's staging copy and copied in place, against the engine reading the same
// version's file (what it does without the weights group). Each timing runs from the trainer's offer (or the update,
// for the file) until a one-token generation on the new version has returned, less the same generation alone; the
// version's weights are checked by greedy decoding: the broadcast version and the file version give the same tokens.
// Needs two GPUs. Prints one JSON line.
//   node --import tsx test/gpu/engines-bench.ts [--shape 0.5B|1.5B|3B] [--rounds 3]
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Model, type ModelConfig } from '../../native/index.ts';
import { EngineProcesses } from '../../producers/policy/engine-processes.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { tempDir } from '../../testkit/events.ts';

// Qwen2.5's shapes (hidden, layers, heads, KV heads, MLP, vocabulary), as trainer-dp.ts builds them
const SHAPES: Record<string, [number, number, number, number, number, number]> = {
  '0.5B': [896, 24, 14, 2, 4864, 151936],
  '1.5B': [1536, 28, 12, 2, 8960, 151936],
  '3B': [2048, 36, 16, 2, 11008, 151936],
};
const { values } = parseArgs({ options: { shape: { type: 'string', default: '1.5B' }, rounds: { type: 'string', default: '3' } } });
const [hidden, layers, heads, kvHeads, ffn, vocab] = SHAPES[values.shape!] ?? (() => { throw new Error(`--shape: one of ${Object.keys(SHAPES).join(', ')}`); })();
const config: ModelConfig = { hidden_size: hidden, num_hidden_layers: layers, num_attention_heads: heads, num_key_value_heads: kvHeads, intermediate_size: ffn, vocab_size: vocab, rope_theta: 1e6, rms_norm_eps: 1e-6, tie_word_embeddings: false, max_position_embeddings: 4096, attention_bias: true, model_type: 'qwen2' };
const configJson = JSON.stringify(config);
const rounds = Number(values.rounds);

const dir = tempDir('engines-bench');
const v0Path = join(dir, 'v0.safetensors');
const v1Path = join(dir, 'v1.safetensors');
const t0 = performance.now();
const v0 = Model.init(config, { seed: 1, device: 'cuda', trainable: false });
await v0.save(v0Path);
v0.dispose();
// the trainer's model, other weights than the engine starts with
const trainer = Model.init(config, { seed: 2, device: 'cuda', trainable: true });
await trainer.save(v1Path);
const setupS = (performance.now() - t0) / 1000;

const t1 = performance.now();
const fleet = await EngineProcesses.start({
  devices: [1],
  device: 'cuda',
  source: { configJson, weightsPath: v0Path, version: 0 },
  maxBatch: 8,
  maxLen: 256,
  gpuMemoryUtilization: 0.5,
  interrupt: 'next_token',
  weightsGroup: 'cuda',
  manager: { healthIntervalMs: 0 },
});
const startS = (performance.now() - t1) / 1000;

const greedy = (n: number) => ({ temperature: 0, top_p: 1, top_k: 0, max_new_tokens: n, seed: 1, stop_token_ids: [] }) as SamplingParams;
const prompt = Array.from({ length: 32 }, (_, i) => (i * 7919) % 1000 + 10);
let req = 0;
const gen = (n: number) => fleet.generate({ requestId: `r${req++}`, promptIds: prompt, sampling: greedy(n) });
const timed = async (f: () => Promise<unknown>) => {
  const s = performance.now();
  await f();
  return performance.now() - s;
};

const tokensV0 = (await gen(16)).tokenIds;
let version = 0;
const rows: { broadcast_ms: number; file_ms: number; generate_ms: number }[] = [];
let sameTokens = true;
let differsFromV0 = false;
for (let r = 0; r < rounds; r++) {
  const generateMs = await timed(() => gen(1));
  const b = ++version;
  const broadcastMs = await timed(async () => {
    fleet.stageWeights(b, trainer);
    await fleet.updatePolicy({ version: b, weightsPath: join(dir, 'never-written.safetensors'), configJson });
    await gen(1);
  });
  const viaBroadcast = await gen(16);
  const f = ++version;
  const fileMs = await timed(async () => {
    await fleet.updatePolicy({ version: f, weightsPath: v1Path, configJson });
    await gen(1);
  });
  const viaFile = await gen(16);
  sameTokens &&= JSON.stringify(viaBroadcast.tokenIds) === JSON.stringify(viaFile.tokenIds) && viaBroadcast.policyVersions.every((v) => v === b);
  differsFromV0 ||= JSON.stringify(viaBroadcast.tokenIds) !== JSON.stringify(tokensV0);
  rows.push({ broadcast_ms: Math.round(broadcastMs - generateMs), file_ms: Math.round(fileMs - generateMs), generate_ms: Math.round(generateMs) });
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
console.log(
  JSON.stringify({
    shape: values.shape,
    parameters_gb_fp32: Number(((trainer.trainRange().numel * 4) / 1e9).toFixed(2)),
    rounds: rows,
    broadcast_ms_median: median(rows.map((r) => r.broadcast_ms)),
    file_ms_median: median(rows.map((r) => r.file_ms)),
    same_tokens_broadcast_and_file: sameTokens,
    new_version_changes_tokens: differsFromV0,
    engine_start_s: Number(startS.toFixed(1)),
    setup_s: Number(setupS.toFixed(1)),
  }),
);
await fleet.close();
trainer.dispose();
if (!sameTokens) process.exitCode = 1;
