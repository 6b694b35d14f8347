// export.every_versions: a real main job (`rlstream run`, CPU) on a tiny generated Llama directory writes every
// second policy version as a Hugging Face model directory while it trains; each loads back as `model.base: <dir>`
// (config, tokenizer and weights from the directory) and scores exactly as the version's own weights file, named
// by its PolicyVersion event in the run's log. A directory already at a version's place is left as it was.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { compileRunConfig } from '../../cli/config/run-config.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { readIndex } from '../../core/weights/hf-dir.ts';
import { parseModelConfig } from '../../core/weights/model-config.ts';
import { Model, nativeAvailable } from '../../native/index.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';
import { writeTinyModelDir } from '../../testkit/hf-model.ts';
import { BIN } from '../admin/helpers.ts';
import { maxAbsDiff, pack, randomSeqs, rng } from '../native/helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const REPO = join(import.meta.dirname, '..', '..');
const dir = mkdtempSync(join(tmpdir(), 'export-every-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Every PolicyVersion in the run's embedded log, by version. */
async function versionsOf(logDir: string): Promise<Map<number, PolicyVersion>> {
  const log = openEmbeddedLog({ dir: logDir });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const ends = await log.offsets(TOPICS.policyVersions);
    const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
    const consumer = await log.consumer({ groupId: 'export-every-test', topics: [TOPICS.policyVersions], readCommitted: true, fromBeginning: true });
    const out = new Map<number, PolicyVersion>();
    try {
      await readToEnd(consumer, TOPICS.policyVersions, target, async (records) => {
        for (const r of records) {
          const ev = await serde.decode(r.value);
          if (ev.name === 'PolicyVersion') out.set(ev.value.policy_version, ev.value);
        }
      }, { what: 'policy versions', timeoutMs: 30_000 });
    } finally {
      await consumer.close();
    }
    return out;
  } finally {
    await log.close();
  }
}

test('export.every_versions writes every N-th version during a run; each loads as model.base and scores as the version did', { skip, timeout: 600_000 }, async () => {
  const base = join(dir, 'base');
  writeTinyModelDir(base, { family: 'llama', tied: false, shards: 2, vocab: 512, tokenizer: false, seed: 5, configPatch: { max_position_embeddings: 512 } });
  // the calculator task's own small tokenizer (vocabulary under 512), as the base directory's
  cpSync(join(REPO, 'examples', 'calculator', 'tokenizer'), base, { recursive: true });
  const exports = join(dir, 'exports');
  // a directory already where version 4 goes: never overwritten
  mkdirSync(join(exports, 'v4'), { recursive: true });
  writeFileSync(join(exports, 'v4', 'mine.txt'), 'not the run\'s');
  const config = join(dir, 'config.yaml');
  writeFileSync(
    config,
    `run: { id: export-every, data_dir: ${join(dir, 'data')}, seed: 2 }
log: { kind: embedded }
traces: { kind: none }
model: { base: ${base} }
task: { name: calculator, train: easy, heldout: easy, heldout_problems: 2 }
rollout: { n: 2, concurrency: 4, response_length: 16, max_assistant_turns: 1 }
trainer: { device: cpu, max_steps: 6, groups_per_step: 1, keep_versions: 20, learning_rate: 0.01, weight_decay: 0.1, entropy_coef: 0.01 }
eval: { every_steps: 100 }
export: { every_versions: 2, dir: ${exports}, max_shard_size: 20000 }
`,
  );
  const r = spawnSync(process.execPath, [BIN, 'run', config, '--new', '--no-admin', '--no-progress'], { encoding: 'utf8', timeout: 540_000 });
  assert.equal(r.status, 0, r.stderr.slice(-3000));
  const summary = JSON.parse(r.stdout.trim().split('\n').pop()!) as { data_dir: string; steps: number };
  assert.equal(summary.steps, 6);

  // v2 and v6 written; v4 left as it was (and said so); no other version
  assert.deepEqual(readdirSync(exports).sort(), ['v2', 'v4', 'v6']);
  assert.deepEqual(readdirSync(join(exports, 'v4')), ['mine.txt']);
  assert.match(r.stderr, /export: directory exists, not overwritten.*v4/);

  const versions = await versionsOf(join(summary.data_dir, 'log'));
  assert.ok(versions.has(6), `versions: ${[...versions.keys()].join(', ')}`);
  const { batch, targets } = pack(randomSeqs(rng(3), [24, 9, 40], 512));
  const scored = new Map<number, Float32Array>();
  for (const v of [2, 6]) {
    const out = join(exports, `v${v}`);
    const files = readdirSync(out);
    for (const f of ['config.json', 'generation_config.json', 'model.safetensors.index.json', 'tokenizer.json', 'tokenizer_config.json']) assert.ok(files.includes(f), `${out}: ${f}`);
    assert.ok(new Set(readIndex(out).weightMap.values()).size >= 2, 'sharded at 20 kB');
    // model.base: <exported dir> is all a config needs
    const cfg = compileRunConfig({ model: { base: out }, task: { name: 'calculator' } }, dir);
    assert.equal(cfg.model.init, out);
    assert.equal(cfg.model.tokenizer, out);
    const modelCfg = parseModelConfig(readFileSync(cfg.model.config!, 'utf8'));
    assert.deepEqual(modelCfg, parseModelConfig(versions.get(v)!.config_json));
    ChatTokenizer.load(cfg.model.tokenizer!);
    const fromExport = Model.load(cfg.model.init!, modelCfg, { threads: 1, trainable: false });
    const fromVersion = Model.load(versions.get(v)!.weights_uri, modelCfg, { threads: 1, trainable: false });
    const a = (await fromExport.forward(batch, targets)).logprobs;
    const b = (await fromVersion.forward(batch, targets)).logprobs;
    assert.deepEqual(a, b, `v${v}: the export scores as the version's own weights`);
    scored.set(v, a);
    fromExport.dispose();
    fromVersion.dispose();
  }
  // and the versions differ: each directory is its own version, not one written twice
  assert.ok(maxAbsDiff(scored.get(2)!, scored.get(6)!) > 1e-6, 'v2 and v6 score differently');
  assert.equal(existsSync(join(exports, 'v1')) || existsSync(join(exports, 'v3')), false);
});
