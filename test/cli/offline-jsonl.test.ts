// The offline commands (score, advantage, tokenize) share one JSONL reader and one bad-line policy, run here
// as real child processes: good lines are written, each bad line is reported on stderr with its line number,
// and the exit code is 1 at the end. Bad lines include invalid UTF-8 (never scored or tokenized as U+FFFD) and,
// for advantage, rewards whose statistics overflow (±1e308, ±1e200).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'node:test';
import { readJsonl, type JsonlItem } from '../../core/jsonl.ts';

const REPO = join(import.meta.dirname, '..', '..');
const BIN = join(REPO, 'bin', 'rlstream.js');
const TOKENIZER = join(REPO, 'examples', 'calculator', 'tokenizer');
/** 0xff never occurs in UTF-8. */
const BAD_UTF8 = Buffer.from([0xff, 0xfe]);

function run(args: string[], input: Buffer) {
  const r = spawnSync(process.execPath, [BIN, ...args], { input, encoding: 'utf8', timeout: 60_000 });
  return { code: r.status, stdout: r.stdout, out: r.stdout.trim() === '' ? [] : r.stdout.trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>), stderr: r.stderr };
}

const lines = (...parts: (string | Buffer)[]) => Buffer.concat(parts.map((p) => Buffer.concat([typeof p === 'string' ? Buffer.from(p) : p, Buffer.from('\n')])));

/** Lines 2 and 4 are bad in every command: not JSON, and invalid UTF-8 inside a string. */
const CASES: { name: string; args: string[]; good: (i: number) => string; bad: string; check: (row: Record<string, unknown>) => void }[] = [
  { name: 'score', args: ['score', '--reward', 'gsm8k'], good: (i) => `{"id":${i},"solution_str":"#### ${i}","ground_truth":"${i}"}`, bad: '{"id":9,"solution_str":"#### ', check: (r) => assert.equal(r['score'], 1) },
  { name: 'advantage', args: ['advantage', '--estimator', 'grpo'], good: (i) => `{"id":${i},"trajectory_id":"t${i}","group_id":"g","reward":${i},"response_mask":[1]}`, bad: '{"id":9,"trajectory_id":"t9","group_id":"', check: (r) => assert.ok(Array.isArray(r['advantages'])) },
  { name: 'tokenize', args: ['tokenize', '--tokenizer', TOKENIZER], good: (i) => `{"id":${i},"messages":[{"role":"user","content":"${i}"}]}`, bad: '{"id":9,"messages":[{"role":"user","content":"', check: (r) => assert.ok(Array.isArray(r['ids'])) },
];

for (const c of CASES) {
  test(`${c.name}: good lines out, each bad line reported with its number (invalid UTF-8 included), exit 1 at the end`, () => {
    const input = lines(c.good(1), '{not json', c.good(3), Buffer.concat([Buffer.from(c.bad), BAD_UTF8, Buffer.from('"}]}')]), '', c.good(6));
    const r = run(c.args, input);
    assert.equal(r.code, 1, r.stderr);
    assert.deepEqual(r.out.map((x) => x['id']), [1, 3, 6]);
    for (const row of r.out) c.check(row);
    assert.match(r.stderr, new RegExp(`rlstream ${c.name}: line 2: not JSON`));
    assert.match(r.stderr, new RegExp(`rlstream ${c.name}: line 4: not valid UTF-8`));
    assert.doesNotMatch(r.stderr, /line [1356]:/);
    assert.doesNotMatch(r.stdout, /\uFFFD/);
    const clean = run(c.args, lines(c.good(1), c.good(3)));
    assert.equal(clean.code, 0, clean.stderr);
    assert.equal(clean.stderr, '');
  });
}

test('advantage: rewards whose mean or deviation overflow (±1e308, ±1e200) are bad lines, other groups are estimated', () => {
  const row = (id: string, g: string, reward: string) => `{"trajectory_id":"${id}","group_id":"${g}","reward":${reward},"response_mask":[1,1]}`;
  const r = run(['advantage', '--estimator', 'grpo'], lines(row('a', 'huge', '1e308'), row('b', 'huge', '-1e308'), row('c', 'big', '1e200'), row('d', 'big', '-1e200'), row('e', 'ok', '1'), row('f', 'ok', '0'), row('g', 'sum', '1e308'), row('h', 'sum', '1e308')));
  assert.equal(r.code, 1);
  assert.deepEqual(r.out.map((x) => x['trajectory_id']), ['e', 'f']);
  for (const x of r.out) for (const a of x['advantages'] as number[]) assert.ok(Number.isFinite(a) && Math.abs(a) > 0.5);
  for (const n of [1, 2, 3, 4, 7, 8]) assert.match(r.stderr, new RegExp(`line ${n}: the rewards of group "(huge|big|sum)" overflow`));
});

test('readJsonl: line numbers across chunk boundaries, CRLF, a last line without newline, blank lines counted', async () => {
  const text = '{"a":1}\r\n\n{"a":2}\n[1]\n{"a":3}';
  const chunks = [...Buffer.from(text)].map((b) => Buffer.from([b]));
  const items: JsonlItem[] = [];
  for await (const i of readJsonl(chunks)) items.push(i);
  assert.deepEqual(items.map((i) => [i.line, i.value?.['a'] ?? i.error]), [[1, 1], [3, 2], [4, 'expected a JSON object'], [5, 3]]);
  // A multi-byte character split across chunks is still one valid character.
  const split = Buffer.from('{"a":"é"}\n');
  const got: JsonlItem[] = [];
  for await (const i of readJsonl([split.subarray(0, 7), split.subarray(7)])) got.push(i);
  assert.equal(got[0]!.value?.['a'], 'é');
});
