// `rlstream preprocess gsm8k` against what verl itself writes. The expected files under
// examples/gsm8k-tool/data/ are the output of verl's own scripts (gsm8k_tool_agent_loop.py at the top,
// gsm8k_multiturn_w_tool.py under multiturn_w_tool/), run unchanged by data/verl-rows.py on GSM8K rows.
// The raw records are taken back out of those files (extra_info.question / .answer are the raw record), so
// the test needs nothing outside the repository. The matrix runs the command's function in-process; one run
// of each outcome goes through the real `rlstream` process (exit status, message, files left behind).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects, parquetSchema, type SchemaTree } from 'hyparquet';
import { parquetWriteBuffer } from 'hyparquet-writer';
import { preprocessGsm8k } from '../../cli/commands/preprocess.ts';
import { REPO } from './helpers.ts';
import { tempDir } from '../../testkit/events.ts';

const DATA = join(REPO, 'examples', 'gsm8k-tool', 'data');
const VARIANTS = [
  { name: 'gsm8k_tool_agent_loop.py', dir: DATA, agentName: 'tool_agent' as string | undefined },
  { name: 'gsm8k_multiturn_w_tool.py', dir: join(DATA, 'multiturn_w_tool'), agentName: undefined },
];
const tmp = () => tempDir('preprocess');
const cli = (args: string[]) => spawnSync(join(REPO, 'node_modules', '.bin', 'tsx'), [join(REPO, 'cli', 'main.ts'), ...args], { encoding: 'utf8', cwd: REPO });

async function readParquet(path: string): Promise<{ rows: Record<string, unknown>[]; schema: unknown }> {
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  // The layout a reader sees: names, physical and logical types, repetition, nesting (not pyarrow's extra metadata).
  const shape = (t: SchemaTree): unknown => ({
    name: t.element.name,
    type: t.element.type ?? null,
    converted: t.element.converted_type ?? null,
    repetition: t.element.repetition_type ?? null,
    children: t.children.map(shape),
  });
  return { rows: await parquetReadObjects({ file, metadata }), schema: shape(parquetSchema(metadata)) };
}

/** JSONL numbers come back as numbers, Parquet INT64 as bigint: compare in one form. */
const plain = (v: unknown): unknown => JSON.parse(JSON.stringify(v, (_k, x) => (typeof x === 'bigint' ? Number(x) : x)));

function rawRecords(rows: Record<string, unknown>[]): { question: string; answer: string }[] {
  return rows.map((r, i) => {
    const extra = r['extra_info'] as { index: bigint; question: string; answer: string };
    assert.equal(Number(extra.index), i, 'verl numbers rows by their position in the split');
    return { question: extra.question, answer: extra.answer };
  });
}

describe("rlstream preprocess gsm8k writes verl's rows", () => {
  for (const variant of VARIANTS) {
    for (const split of ['train', 'test']) {
      test(`${variant.name} ${split}: JSONL and Parquet input, Parquet and JSONL output, column for column`, async () => {
        const expected = await readParquet(join(variant.dir, `${split}.parquet`));
        assert.ok(expected.rows.length >= 30);
        const raw = rawRecords(expected.rows);
        const dir = tmp();
        writeFileSync(join(dir, 'raw.jsonl'), raw.map((r) => JSON.stringify(r)).join('\n') + '\n');
        // GSM8K's own Parquet layout: two string columns.
        const buf = parquetWriteBuffer({
          columnData: [
            { name: 'question', data: raw.map((r) => r.question), type: 'STRING' },
            { name: 'answer', data: raw.map((r) => r.answer), type: 'STRING' },
          ],
        });
        writeFileSync(join(dir, 'raw.parquet'), Buffer.from(buf));
        for (const input of ['raw.jsonl', 'raw.parquet']) {
          const out = join(dir, `${input}.rows.parquet`);
          assert.equal(await preprocessGsm8k({ input: join(dir, input), output: out, split, agentName: variant.agentName }), raw.length);
          const got = await readParquet(out);
          assert.deepEqual(got.schema, expected.schema, `${input}: the Parquet layout differs from verl's`);
          assert.deepEqual(Object.keys(got.rows[0]!), Object.keys(expected.rows[0]!));
          assert.equal(got.rows.length, expected.rows.length);
          for (let i = 0; i < got.rows.length; i++) assert.deepEqual(got.rows[i], expected.rows[i], `${input} row ${i}`);
        }
        const jsonl = join(dir, 'rows.jsonl');
        await preprocessGsm8k({ input: join(dir, 'raw.jsonl'), output: jsonl, split, agentName: variant.agentName });
        const lines = readFileSync(jsonl, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
        assert.deepEqual(lines, plain(expected.rows));
        assert.deepEqual(Object.keys(lines[0]!), Object.keys(expected.rows[0]!), 'JSONL keys in verl order');
      });
    }
  }

  test('the rlstream command: rows written, then a bad record fails naming its line and leaves no output', async () => {
    const dir = tmp();
    const good = { question: 'What is 2+2?', answer: 'It is 4.\n#### 4' };
    writeFileSync(join(dir, 'good.jsonl'), JSON.stringify(good) + '\n');
    const ok = cli(['preprocess', 'gsm8k', '--input', join(dir, 'good.jsonl'), '--output', join(dir, 'good.parquet'), '--agent-name', 'tool_agent']);
    assert.equal(ok.status, 0, ok.stderr);
    assert.match(ok.stderr, /wrote 1 rows/);
    const [row] = (await readParquet(join(dir, 'good.parquet'))).rows;
    assert.equal(row!['agent_name'], 'tool_agent');
    writeFileSync(join(dir, 'raw.jsonl'), [good, good, { question: 'Q', answer: 'no final line' }, good].map((r) => JSON.stringify(r)).join('\n'));
    const r = cli(['preprocess', 'gsm8k', '--input', join(dir, 'raw.jsonl'), '--output', join(dir, 'rows.parquet')]);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /raw\.jsonl line 3: .*#### <number>/);
    await assert.rejects(preprocessGsm8k({ input: join(dir, 'raw.jsonl'), output: join(dir, 'rows.jsonl'), split: 'train' }), /raw\.jsonl line 3/);
    writeFileSync(join(dir, 'bad.parquet'), 'not parquet');
    await assert.rejects(preprocessGsm8k({ input: join(dir, 'bad.parquet'), output: join(dir, 'x.parquet'), split: 'train' }), /cannot read .*bad\.parquet as GSM8K Parquet/);
    // A write that fails (the output's folder does not exist) leaves no temporary file behind either.
    await assert.rejects(preprocessGsm8k({ input: join(dir, 'good.jsonl'), output: join(dir, 'missing', 'x.parquet'), split: 'train' }), /cannot write/);
    assert.deepEqual(readdirSync(dir).sort(), ['bad.parquet', 'good.jsonl', 'good.parquet', 'raw.jsonl']);
    assert.equal(existsSync(join(dir, 'x.parquet')), false);
  });

  test('the rlstream command never writes over its input, and over an existing output only with --force', async () => {
    const dir = tmp();
    const input = join(dir, 'f.jsonl');
    const text = JSON.stringify({ question: 'What is 2+2?', answer: 'It is 4.\n#### 4' }) + '\n';
    writeFileSync(input, text);
    symlinkSync(input, join(dir, 'link.jsonl'));
    for (const output of [input, join(dir, 'link.jsonl'), join(dir, '.', 'f.jsonl')]) {
      for (const force of [[], ['--force']]) {
        const r = cli(['preprocess', 'gsm8k', '--input', input, '--output', output, ...force]);
        assert.notEqual(r.status, 0, `${output} ${force.join(' ')}`);
        assert.match(r.stderr, /--output .* is the same file as --input .*: writing it would destroy the input/);
        assert.equal(readFileSync(input, 'utf8'), text, 'the input is untouched');
      }
    }
    const out = join(dir, 'rows.jsonl');
    writeFileSync(out, 'precious\n');
    const refused = cli(['preprocess', 'gsm8k', '--input', input, '--output', out]);
    assert.notEqual(refused.status, 0);
    assert.match(refused.stderr, /--output .*rows\.jsonl exists; --force replaces it/);
    assert.equal(readFileSync(out, 'utf8'), 'precious\n');
    const forced = cli(['preprocess', 'gsm8k', '--input', input, '--output', out, '--force']);
    assert.equal(forced.status, 0, forced.stderr);
    assert.match(readFileSync(out, 'utf8'), /What is 2\+2\?/);
    const intoDir = cli(['preprocess', 'gsm8k', '--input', input, '--output', dir, '--force']);
    assert.match(intoDir.stderr, /is a directory; name a file/);
  });
});
