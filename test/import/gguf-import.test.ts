// `rlstream import gguf` on a tiny llama GGUF made here: the safetensors hold the Hugging Face tensors the file
// stands for (q/k rows put back), config.json loads into the native core (which then computes what the
// independent reference computes on the original weights), tokenizer.json encodes as the GGUF vocabulary says,
// the chat template renders, and files that cannot be imported fail naming why.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import { isRlstreamError } from '../../core/errors.ts';
import { parseSafetensors } from '../../core/weights/safetensors.ts';
import { importGguf } from '../../core/weights/gguf-import.ts';
import { Model, nativeAvailable, parseModelConfig } from '../../native/index.ts';
import { referenceForward } from '../../native/reference.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { tinyLlama, type MetaEntry, type RawTensor } from './gguf-writer.ts';

const root = mkdtempSync(join(tmpdir(), 'gguf-import-'));
after(() => rmSync(root, { recursive: true, force: true }));
let n = 0;

/** Writes a tiny llama GGUF (optionally edited) and imports it; returns the output directory. */
async function imported(edit?: (m: MetaEntry[], t: RawTensor[]) => void, dtype?: 'F32' | 'BF16'): Promise<{ dir: string; model: ReturnType<typeof tinyLlama> }> {
  const model = tinyLlama(7, edit);
  const path = join(root, `m${++n}.gguf`);
  writeFileSync(path, model.bytes);
  const dir = join(root, `out${n}`);
  await importGguf(path, dir, { dtype });
  return { dir, model };
}

function setMeta(key: string, value: string): (m: MetaEntry[]) => void {
  return (m) => {
    const e = m.find((x) => x.key === key)!;
    e.value = value;
  };
}

test('the safetensors hold the Hugging Face tensors, q/k rows back in rotate-half order, no lm_head when tied', async () => {
  const { dir, model } = await imported();
  const { tensors, metadata } = parseSafetensors(readFileSync(join(dir, 'model.safetensors')));
  assert.equal(metadata['format'], 'pt');
  assert.deepEqual([...tensors.keys()].sort(), [...model.hf.keys()].sort());
  assert.equal(tensors.has('lm_head.weight'), false);
  for (const [name, t] of model.hf) {
    assert.deepEqual(tensors.get(name)!.shape, t.shape, name);
    assert.deepEqual(tensors.get(name)!.data, t.data, name);
  }
  const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  assert.deepEqual(
    { ...parseModelConfig(config) },
    { hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 64, vocab_size: model.tokens.length,
      rope_theta: 10000, rms_norm_eps: Math.fround(1e-5), tie_word_embeddings: true, max_position_embeddings: 64, attention_bias: false, model_type: 'llama', head_dim: 8, rope_scaling: null, sliding_window: null },
  );
  assert.deepEqual([config['architectures'], config['model_type'], config['bos_token_id'], config['eos_token_id']], [['LlamaForCausalLM'], 'llama', 1, 2]);
});

test('--dtype BF16 writes bf16 tensors rounded from the same values', async () => {
  const { dir, model } = await imported(undefined, 'BF16');
  const bytes = readFileSync(join(dir, 'model.safetensors'));
  const headerLen = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLen).toString('utf8')) as Record<string, { dtype?: string }>;
  assert.equal(header['model.layers.0.self_attn.q_proj.weight']!.dtype, 'BF16');
  const q = parseSafetensors(bytes).tensors.get('model.layers.0.self_attn.q_proj.weight')!.data;
  const want = model.hf.get('model.layers.0.self_attn.q_proj.weight')!.data;
  for (let i = 0; i < q.length; i++) assert.ok(Math.abs(q[i]! - want[i]!) <= Math.abs(want[i]!) * 2 ** -8, `element ${i}`);
  assert.equal(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')).torch_dtype, 'bfloat16');
});

test('the native core loads the import and computes what the reference computes on the original weights', { skip: !nativeAvailable() && 'native addon not built' }, async () => {
  const { dir, model } = await imported();
  const cfg = parseModelConfig(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')));
  const m = Model.load(join(dir, 'model.safetensors'), cfg, { threads: 1 });
  try {
    const seqs = [[1, 60, 70, 80, 90, 2], [5, 6, 7, 8, 9, 10, 11, 12, 13]];
    const tokens = Int32Array.from(seqs.flat());
    const seqStarts = Int32Array.from([0, 6, 15]);
    const targets = Int32Array.from(seqs.flatMap((s) => s.map((_, i) => (i + 1 < s.length ? s[i + 1]! : -1))));
    const got = await m.forward({ tokens, seqStarts }, targets);
    const ref = referenceForward(cfg, new Map([...model.hf].map(([k, t]) => [k, Float64Array.from(t.data)])), { tokens, seqStarts }, targets);
    for (let t = 0; t < tokens.length; t++) assert.ok(Math.abs(got.logprobs[t]! - ref.logprobs[t]!) < 1e-4, `position ${t}: ${got.logprobs[t]} vs ${ref.logprobs[t]}`);
  } finally {
    m.dispose();
  }
});

test('tokenizer.json encodes as the GGUF vocabulary and merges say, digits one by one, specials by id', async () => {
  const { dir, model } = await imported();
  const tok = ChatTokenizer.load(dir);
  const id = (t: string): number => model.tokens.indexOf(t);
  // "1 2" is a merge, but the smollm pre-tokenizer splits digits first, as llama.cpp does.
  assert.deepEqual(tok.encode('hello world 12'), ['hello', 'Ġworld', 'Ġ', '1', '2'].map(id));
  assert.deepEqual(tok.encode('<|im_start|>hell'), [1, id('hell')]);
  assert.equal(tok.decode(tok.encode('hello world, héllo! 12')), 'hello world, héllo! 12');
  assert.equal(tok.eosTokenId, 2);
  assert.equal(tok.padTokenId, 2);
  assert.equal(tok.isSpecial(1), true);
  assert.equal(tok.isSpecial(id('hello')), false);
  const text = tok.render([{ role: 'user', content: 'hello' }], { addGenerationPrompt: true });
  assert.equal(text, '<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n');
  assert.deepEqual(tok.encode(text), [1, id('u'), id('s'), id('e'), id('r'), id('Ċ'), id('hello'), 2, id('Ċ'), 1, ...'assistant'.split('').map(id), id('Ċ')]);
});

test('files that cannot be imported fail naming why', async () => {
  const fails = async (edit: (m: MetaEntry[], t: RawTensor[]) => void, pattern: RegExp): Promise<void> => {
    await assert.rejects(imported(edit), (err: unknown) => isRlstreamError(err, 'WEIGHTS_FORMAT') && pattern.test(err.message));
  };
  await fails(setMeta('general.architecture', 'qwen2'), /general\.architecture is "qwen2"; only "llama" models can be imported/);
  await fails(setMeta('tokenizer.ggml.model', 'llama'), /tokenizer\.ggml\.model is "llama"; only byte-level BPE \("gpt2"\) tokenizers/);
  await fails(setMeta('tokenizer.ggml.pre', 'deepseek-coder'), /tokenizer\.ggml\.pre "deepseek-coder" is not a known pre-tokenizer \(known: default, gpt2, smollm/);
  await fails((_m, t) => t.splice(t.findIndex((x) => x.name === 'blk.1.ffn_up.weight'), 1), /lacks tensor\(s\) of a llama model: model\.layers\.1\.mlp\.up_proj\.weight/);
  await fails((_m, t) => t.push({ ...t[1]!, name: 'blk.0.attn_sinks.weight' }), /tensor blk\.0\.attn_sinks\.weight is not part of a llama model/);
  await fails((m) => m.push({ key: 'llama.rope.scaling.type', kind: 'str', value: 'yarn' }), /llama\.rope\.scaling\.type "yarn" is not supported/);
});

test('rlstream import gguf writes the directory and prints a summary; a bad --dtype is refused', async () => {
  const path = join(root, 'cli.gguf');
  writeFileSync(path, tinyLlama(3).bytes);
  const run = promisify(execFile);
  const cli = ['--import', 'tsx', join(import.meta.dirname, '../../cli/main.ts'), 'import', 'gguf', path, '--out', join(root, 'cli-out')];
  const { stdout } = await run(process.execPath, cli);
  const summary = JSON.parse(stdout) as Record<string, unknown>;
  assert.deepEqual(summary['sourceTypes'], { Q8_0: 1, F32: 9, F16: 2, Q4_0: 2, Q4_1: 6 });
  assert.equal(summary['tieWordEmbeddings'], true);
  assert.equal(summary['chatTemplate'], true);
  ChatTokenizer.load(join(root, 'cli-out'));
  await assert.rejects(run(process.execPath, [...cli, '--dtype', 'f8']), (err: { code?: number; stderr?: string }) => err.code === 1 && /--dtype must be f32 or bf16/.test(err.stderr ?? ''));
});
