// `config check` runs what start-up runs, so a config it passes starts: each finding where check said ok and the
// run refused is a problem here, named by its path. The task is the one of docs/tasks.md (files task, reward
// module, tool YAML), written to a temporary directory, then broken one way at a time: a verl tool class that maps
// to nothing, a module tool whose export is misspelt, a files task whose model.init is missing, a dataset that is
// /etc/passwd, a directory or rows of the wrong shape, a model config and a tokenizer that cannot be loaded.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { checkConfig } from '../../cli/run/preflight.ts';

const ROOT = join(import.meta.dirname, '..', '..');
let dir: string;
let config: string;

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-preflight-'));
  const text = readFileSync(join(ROOT, 'docs', 'tasks.md'), 'utf8');
  for (const m of text.matchAll(/<!-- file: (\S+) -->\n```\w*\n([\s\S]*?)```/g)) writeFileSync(join(dir, m[1]!), m[1] === 'config.yaml' ? m[2]!.replaceAll('RLSTREAM', ROOT) : m[2]!);
  config = join(dir, 'config.yaml');
});

after(() => rmSync(dir, { recursive: true, force: true }));

async function problems(overrides: Record<string, unknown>): Promise<string[]> {
  return (await checkConfig(config, overrides)).problems;
}

test('the intact task checks ok (each case below breaks one thing)', async () => {
  assert.deepEqual(await problems({}), []);
});

test('tools.config: a verl class that maps to no rlstream tool, and a module tool whose export is misspelt', async () => {
  writeFileSync(join(dir, 'verl-tools.yaml'), 'tools:\n  - class_name: verl.tools.foo.Bar\n    config: {}\n');
  const verl = await problems({ 'tools.config': 'verl-tools.yaml' });
  assert.equal(verl.length, 1, verl.join('\n'));
  assert.match(verl[0]!, /^tools\.config \(\S+verl-tools\.yaml\): tools\[0\]\.class_name: no rlstream tool for "verl\.tools\.foo\.Bar"/);

  writeFileSync(
    join(dir, 'count_tool.ts'),
    "export class CountLetters {\n  schema = { type: 'function', function: { name: 'count', description: 'letters', parameters: { type: 'object', properties: {} } } };\n  constructor(_config: unknown) {}\n  async execute(): Promise<{ text: string }> { return { text: '0' }; }\n}\n",
  );
  writeFileSync(join(dir, 'module-tools.yaml'), 'tools:\n  - class_name: ./count_tool.ts:CountLeters\n');
  const typo = await problems({ 'tools.config': 'module-tools.yaml' });
  assert.equal(typo.length, 1, typo.join('\n'));
  assert.match(typo[0]!, /tools\[0\]\.class_name\.export: \.\/count_tool\.ts has no export "CountLeters" \(did you mean CountLetters\?\)/);
  writeFileSync(join(dir, 'module-tools.yaml'), 'tools:\n  - class_name: ./count_tool.ts:CountLetters\n');
  assert.deepEqual(await problems({ 'tools.config': 'module-tools.yaml' }), []);
});

test("model.init missing: fine for a task with SFT demonstrations (the run trains it), a problem for the files task", async () => {
  const missing = await problems({ 'model.init': join(dir, 'no-such-checkpoint') });
  assert.deepEqual(missing, [`model.init: ${join(dir, 'no-such-checkpoint')} does not exist and task files has no SFT demonstrations to train it; point model.init at existing weights`]);
  const calculator = await checkConfig(join(ROOT, 'examples', 'calculator', 'config.yaml'), { 'model.init': join(dir, 'no-such-checkpoint') });
  assert.deepEqual(calculator.problems, []);
});

test('datasets: /etc/passwd, a directory, an empty file and rows of the wrong shape are refused naming the field or the line', async () => {
  const passwd = await problems({ 'dataset.train': '/etc/passwd' });
  assert.equal(passwd.length, 1, passwd.join('\n'));
  assert.match(passwd[0]!, /^dataset\.train: \/etc\/passwd has no known extension \(\.jsonl, \.parquet\); set dataset\.loader/);
  mkdirSync(join(dir, 'rows.jsonl'));
  assert.deepEqual(await problems({ 'dataset.heldout': 'rows.jsonl' }), [`dataset.heldout: ${join(dir, 'rows.jsonl')} is a directory; name a file`]);
  writeFileSync(join(dir, 'empty.jsonl'), '');
  assert.deepEqual(await problems({ 'dataset.train': 'empty.jsonl' }), [`dataset.train: task files gives no training rows (${join(dir, 'empty.jsonl')} is empty)`]);
  writeFileSync(join(dir, 'wrong.jsonl'), readFileSync(join(dir, 'heldout.jsonl'), 'utf8') + '{"question": "What is 2+2?", "answer": "4"}\n');
  // Held-out rows are read as far as the run reads them (task.heldout_problems, 2 in this config), every one checked.
  assert.deepEqual(await problems({ 'dataset.heldout': 'wrong.jsonl' }), []);
  const wrong = await problems({ 'dataset.heldout': 'wrong.jsonl', 'task.heldout_problems': 3 });
  assert.equal(wrong.length, 1, wrong.join('\n'));
  assert.match(wrong[0]!, /wrong\.jsonl line 3: /);
  const train = await problems({ 'dataset.train': 'wrong.jsonl' });
  assert.equal(train.length, 1, train.join('\n'));
  assert.match(train[0]!, /wrong\.jsonl line 3: /);
});

test('model files: a model config that is not one, a tokenizer directory without its files, weights that are not safetensors', async () => {
  writeFileSync(join(dir, 'model.json'), '{"hidden_size": "big"}');
  const model = await problems({ 'model.config': 'model.json' });
  assert.equal(model.length, 1, model.join('\n'));
  assert.match(model[0]!, /^model\.config: \S+model\.json is not a model configuration: /);
  mkdirSync(join(dir, 'tok'));
  const tok = await problems({ 'model.tokenizer': 'tok' });
  assert.equal(tok.length, 1, tok.join('\n'));
  assert.match(tok[0]!, /^model\.tokenizer: \S+tok cannot be loaded: .*tokenizer\.json/);
  assert.deepEqual(await problems({ 'model.tokenizer': 'reward.ts' }), [`model.tokenizer: ${join(dir, 'reward.ts')} is a file; name a directory`]);
  writeFileSync(join(dir, 'junk.safetensors'), 'not weights at all');
  const weights = await problems({ 'model.init': 'junk.safetensors' });
  assert.equal(weights.length, 1, weights.join('\n'));
  assert.match(weights[0]!, /^model\.init: \S+junk\.safetensors is not a safetensors file: /);
});

test('rlstream run refuses what config check refuses, with the same problems, before it writes anything', { timeout: 120_000 }, () => {
  const cli = (args: string[]) => spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'cli', 'main.ts'), ...args], { encoding: 'utf8', cwd: ROOT });
  writeFileSync(join(dir, 'verl-run.yaml'), 'tools:\n  - class_name: verl.tools.foo.Bar\n    config: {}\n');
  // Two problems of two kinds: a tool class that resolves to nothing, a dataset that is not one.
  const sets = ['--set', 'tools.config=verl-run.yaml', '--set', 'dataset.train=/etc/passwd'];
  const check = cli(['config', 'check', config, ...sets]);
  assert.equal(check.status, 1, check.stderr);
  const problemLines = check.stderr.trimEnd().split('\n');
  assert.equal(problemLines[0], `${config}: 2 problem(s)`);
  const dataDir = join(dir, 'refused-run');
  const run = cli(['run', config, ...sets, '--set', `run.data_dir=${dataDir}`, '--new', '--no-admin', '--no-progress']);
  assert.equal(run.status, 1, run.stderr);
  assert.equal(run.stdout, '', 'no summary line');
  assert.equal(run.stderr.trimEnd(), `rlstream: CONFIG_INVALID: ${problemLines.join('\n')}`);
  assert.equal(existsSync(dataDir), false, 'the refused run wrote nothing');
});

test("device 'cuda' on a machine that cannot run it: config check names trainer.device and backend.device with the fix, as the run would refuse at start", async () => {
  const { cudaAvailable } = await import('../../native/index.ts');
  const gpu = join(ROOT, 'examples', 'calculator', 'config.gpu.yaml');
  const both = await checkConfig(gpu, { 'backend.device': 'cuda' });
  if (cudaAvailable()) {
    assert.ok(!both.problems.some((p) => /\.device: 'cuda' cannot run/.test(p)), both.problems.join('\n'));
    return;
  }
  const named = both.problems.filter((p) => /'cuda' cannot run in this process/.test(p));
  assert.deepEqual(named.map((p) => p.split(':')[0]).sort(), ['backend.device', 'trainer.device'], both.problems.join('\n'));
  for (const p of named) assert.match(p, /RLSTREAM_CUDA=1|set (trainer|backend)\.device: cpu/);
  // the same config on the cpu checks clean of them
  const cpu = await checkConfig(gpu, { 'trainer.device': 'cpu' });
  assert.ok(!cpu.problems.some((p) => /cannot run in this process/.test(p)), cpu.problems.join('\n'));
});
