// Datasets (JSONL, Parquet, generators), GSM8K preprocessing, and the `rlstream preprocess` / `tokenize`
// commands run as real processes.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { parquetWriteBuffer } from 'hyparquet-writer';
import { readJsonlRows, readParquetRows, readRows } from '../../producers/dataset/files.ts';
import { gsm8kRow } from '../../producers/dataset/gsm8k.ts';
import { verlGsm8kSolution } from '../../producers/dataset/verl-gsm8k.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import { tempDir } from '../../testkit/events.ts';
import { GSM8K_DIR, QWEN3_DIR, REPO, gsm8kRecords, qwen3 } from './helpers.ts';

const tmp = () => tempDir('dataset');
const cli = (args: string[], input?: string) => spawnSync(join(REPO, 'node_modules', '.bin', 'tsx'), [join(REPO, 'cli', 'main.ts'), ...args], { input, encoding: 'utf8', cwd: REPO });

async function collect(it: AsyncIterable<DatasetRow>): Promise<DatasetRow[]> {
  const out: DatasetRow[] = [];
  for await (const r of it) out.push(r);
  return out;
}

describe('GSM8K preprocessing', () => {
  test('ground truth from "#### N" with commas removed; tools_kwargs carry it', () => {
    assert.equal(verlGsm8kSolution('blah\n#### 1,200'), '1200');
    assert.equal(verlGsm8kSolution('#### -3.5'), '-3.5');
    assert.throws(() => verlGsm8kSolution('no answer'), /#### <number>/);
    // verl's extract_solution: the first match (the reward takes the last one), and the space is required.
    assert.equal(verlGsm8kSolution('#### 5 then #### 7'), '5');
    assert.throws(() => verlGsm8kSolution('####7'), /#### <number>/);
    const row = gsm8kRow(gsm8kRecords('train', 1)[0]!, 0, 'train');
    assert.equal(row.reward_model.ground_truth, '72');
    assert.equal(row.agent_name, 'tool_agent');
    assert.deepEqual(row.extra_info?.tools_kwargs, { calculator: { create_kwargs: { ground_truth: '72' } } });
    assert.equal(row.prompt[0]!.role, 'system');
    assert.match(row.prompt[0]!.content, /`calculator`/);
  });

  test('rlstream preprocess gsm8k writes rows readRows accepts', async () => {
    const out = join(tmp(), 'rows.jsonl');
    const r = cli(['preprocess', 'gsm8k', '--input', join(GSM8K_DIR, 'test.jsonl'), '--output', out, '--split', 'test', '--limit', '50']);
    assert.equal(r.status, 0, r.stderr);
    const rows = await collect(readRows(out));
    assert.equal(rows.length, 50);
    assert.ok(rows.every((x) => x.extra_info?.split === 'test' && /^-?\d+(\.\d+)?$/.test(x.reward_model.ground_truth)));
    // A fresh output path: an existing one is refused first (without --force), which is not what this checks.
    const bad = cli(['preprocess', 'gsm8k', '--input', '/nonexistent.jsonl', '--output', join(tmp(), 'other.jsonl')]);
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr, /cannot read/);
  });
});

describe('row sources', () => {
  test('JSONL: rows validated, errors name the line', async () => {
    const dir = tmp();
    const good = gsm8kRow(gsm8kRecords('train', 1)[0]!, 0, 'train');
    writeFileSync(join(dir, 'a.jsonl'), JSON.stringify(good) + '\n\n' + JSON.stringify({ ...good, reward_model: { ground_truth: 5 } }) + '\n');
    const rows = await collect(readJsonlRows(join(dir, 'a.jsonl')));
    assert.equal(rows.length, 2);
    assert.equal(rows[1]!.reward_model.ground_truth, '5');
    writeFileSync(join(dir, 'b.jsonl'), JSON.stringify(good) + '\n' + JSON.stringify({ ...good, prompt: [] }) + '\n');
    await assert.rejects(collect(readJsonlRows(join(dir, 'b.jsonl'))), /b\.jsonl line 2: prompt must be a non-empty array/);
    writeFileSync(join(dir, 'c.jsonl'), '{oops\n');
    await assert.rejects(collect(readJsonlRows(join(dir, 'c.jsonl'))), /c\.jsonl line 1: not JSON/);
    await assert.rejects(async () => readRows(join(dir, 'x.csv')), /unknown format/);
  });

  test('Parquet: nested prompt and JSON-text columns', async () => {
    const dir = tmp();
    const recs = gsm8kRecords('train', 3);
    const rows = recs.map((r, i) => gsm8kRow(r, i, 'train'));
    const buf = parquetWriteBuffer({
      columnData: [
        { name: 'data_source', data: rows.map((r) => r.data_source), type: 'STRING' },
        { name: 'agent_name', data: rows.map((r) => r.agent_name ?? null), type: 'STRING' },
        { name: 'prompt', data: rows.map((r) => JSON.stringify(r.prompt)), type: 'STRING' },
        { name: 'reward_model', data: rows.map((r) => JSON.stringify(r.reward_model)), type: 'STRING' },
        { name: 'extra_info', data: rows.map((r) => JSON.stringify(r.extra_info)), type: 'STRING' },
      ],
    });
    writeFileSync(join(dir, 'rows.parquet'), Buffer.from(buf));
    const back = await collect(readParquetRows(join(dir, 'rows.parquet'), { batchRows: 2 }));
    assert.deepEqual(back, rows);
    writeFileSync(join(dir, 'bad.parquet'), 'not parquet at all');
    await assert.rejects(collect(readParquetRows(join(dir, 'bad.parquet'))), /not a Parquet file/);
  });
});

describe('rlstream tokenize', () => {
  test('adds text and ids; malformed lines are named and the exit code is non-zero', () => {
    const tok = qwen3();
    const good = { messages: [{ role: 'user', content: 'What is 2+2?' }], tools: [{ type: 'function', function: { name: 'calculator', parameters: { type: 'object' } } }] };
    const input = [JSON.stringify(good), '{"messages": 3}', 'not json', JSON.stringify({ messages: [{ role: 'assistant', content: null, tool_calls: [{ type: 'function', function: { name: 'calculator', arguments: '{"expression": "2+2"}' } }] }] })].join('\n');
    const r = cli(['tokenize', '--tokenizer', QWEN3_DIR, '--generation-prompt'], input);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /line 2: .*"messages" must be an array/);
    assert.match(r.stderr, /line 3: .*not valid JSON/);
    const out = r.stdout.trim().split('\n').map((l) => JSON.parse(l) as { text: string; ids: number[] });
    assert.equal(out.length, 2);
    assert.equal(out[0]!.text, tok.render(good.messages, { tools: good.tools as never, addGenerationPrompt: true }));
    assert.deepEqual(out[0]!.ids, tok.encode(out[0]!.text));
    assert.ok(out[1]!.text.includes('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'));
    assert.ok(readFileSync(join(QWEN3_DIR, 'tokenizer.json')).length > 1_000_000);
  });
});
