// A user's path to a pretrained model, as the SmolLM2 example takes it (examples/calculator/config.smollm2.yaml):
// `rlstream import gguf` writes a model directory, and a config names it as model.base (what SFT begins from) with
// model.chat_template (a tool-call template the model's own lacks). Run here on a tiny llama GGUF the test writes.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';
import { isRlstreamError } from '../../core/errors.ts';
import { parseSafetensors } from '../../core/weights/safetensors.ts';
import { nativeAvailable } from '../../native/index.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { tinyLlama } from './gguf-writer.ts';

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '../..');
const CLI = ['--import', 'tsx', join(ROOT, 'cli/main.ts')];
const TEMPLATE = join(ROOT, 'examples/calculator/chat-template.jinja');
const dir = mkdtempSync(join(tmpdir(), 'pretrained-base-'));
after(() => rmSync(dir, { recursive: true, force: true }));

let imported: Promise<string> | null = null;
/** The tiny GGUF imported once by the CLI, as a user would; returns the model directory. */
function importedModel(): Promise<string> {
  imported ??= (async () => {
    // Room for a calculator demonstration in byte-level tokens (the writer's default context is 64).
    const gguf = tinyLlama(11, (m) => {
      m.find((e) => e.key === 'llama.context_length')!.value = 1024;
    });
    writeFileSync(join(dir, 'tiny.gguf'), gguf.bytes);
    await run(process.execPath, [...CLI, 'import', 'gguf', join(dir, 'tiny.gguf'), '--out', join(dir, 'model')]);
    return join(dir, 'model');
  })();
  return imported;
}

function writeConfig(name: string, chatTemplate: string): string {
  const path = join(dir, name);
  writeFileSync(
    path,
    `run: { id: base-test, data_dir: ${join(dir, 'data')}, seed: 3 }
log: { kind: embedded }
traces: { kind: none }
model:
  config: model/config.json
  tokenizer: model
  chat_template: ${chatTemplate}
  base: model
  init: never-trained
task: { name: calculator }
sft:
  batch_tokens: 1024
  micro_batch_tokens: 1024
  stages:
    - { problems: 6, steps: 1, learning_rate: 1.0e-12, warmup_steps: 0 }
trainer: { device: cpu }
`,
  );
  return path;
}

const calculatorCall = [
  { role: 'user' as const, content: 'Tom has 3 apples. Tom gets 4 more. How many apples does Tom have now?' },
  { role: 'assistant' as const, content: '', tool_calls: [{ id: 'c0', type: 'function' as const, function: { name: 'calculator', arguments: '{"expression": "3+4"}' } }] },
];

test('model.chat_template replaces the imported template; a missing file is named at start-up', async () => {
  const model = await importedModel();
  const own = ChatTokenizer.load(model).render(calculatorCall);
  const replaced = ChatTokenizer.load(model, TEMPLATE).render(calculatorCall);
  assert.doesNotMatch(own, /<tool_call>/, 'the GGUF template renders no tool calls');
  assert.match(replaced, /<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "3\+4"\}\}\n<\/tool_call><\|im_end\|>/);
  assert.throws(() => ChatTokenizer.load(model, join(dir, 'nope.jinja')), (e) => isRlstreamError(e, 'TOKENIZER') && /model\.chat_template: .*nope\.jinja not found/.test(e.message));

  const bad = writeConfig('bad.yaml', 'missing.jinja');
  await assert.rejects(run(process.execPath, [...CLI, 'config', 'check', bad]), (err: { code?: number; stdout?: string; stderr?: string }) => err.code === 1 && /model\.chat_template: .*missing\.jinja does not exist/.test(`${err.stdout}${err.stderr}`));
  const good = writeConfig('good.yaml', TEMPLATE);
  const { stdout } = await run(process.execPath, [...CLI, 'config', 'check', good]);
  assert.match(stdout, /ok/);
});

test('rlstream sft begins from model.base: one step at a vanishing learning rate leaves the imported weights', { skip: !nativeAvailable() && 'native addon not built' }, async () => {
  const model = await importedModel();
  const config = writeConfig('sft.yaml', TEMPLATE);
  const out = join(dir, 'sft');
  const { stdout } = await run(process.execPath, [...CLI, 'sft', config, '--out', out]);
  const summary = JSON.parse(stdout.trim().split('\n').pop()!) as { steps: number; final_loss: number };
  assert.equal(summary.steps, 1);
  assert.ok(Number.isFinite(summary.final_loss));
  const base = parseSafetensors(readFileSync(join(model, 'model.safetensors')));
  const trained = parseSafetensors(readFileSync(join(out, 'model.safetensors')));
  let compared = 0;
  for (const [name, t] of base.tensors) {
    const u = trained.tensors.get(name);
    assert.ok(u, `${name} in the SFT output`);
    const a = t.data;
    const b = u.data;
    assert.equal(a.length, b.length, name);
    for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i]! - b[i]!) < 1e-6, `${name}[${i}]: ${a[i]} vs ${b[i]}`);
    compared++;
  }
  assert.ok(compared >= 10, `compared ${compared} tensors`);
});
