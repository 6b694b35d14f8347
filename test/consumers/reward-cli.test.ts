// `rlstream score` and `rlstream advantage` through real child processes: good input, malformed input.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = join(import.meta.dirname, '../../bin/rlstream.js');

function run(args: string[], input: string) {
  const r = spawnSync(process.execPath, [BIN, ...args], { input, encoding: 'utf8', timeout: 60_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

test('score --reward gsm8k adds "score" to each line, strict and flexible, with format and correct scores', () => {
  const input = [
    { solution_str: 'She has 3 + 4 = 7 apples.\n#### 7', ground_truth: '7', id: 1 },
    { solution_str: 'The answer is 7', ground_truth: '7', id: 2 },
    { solution_str: '#### 8', ground_truth: '7', id: 3 },
  ].map((l) => JSON.stringify(l)).join('\n') + '\n';
  const strict = run(['score', '--reward', 'gsm8k'], input);
  assert.equal(strict.code, 0, strict.stderr);
  const s = strict.stdout.trim().split('\n').map((l) => JSON.parse(l) as { id: number; score: number; ground_truth: string });
  assert.deepEqual(s.map((x) => x.score), [1, 0, 0]);
  assert.equal(s[0]!.ground_truth, '7'); // the input line is kept
  const flex = run(['score', '--reward', 'gsm8k', '--method', 'flexible', '--format-score', '0.1', '--score', '2'], input);
  assert.equal(flex.code, 0, flex.stderr);
  assert.deepEqual(flex.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { score: number }).score), [2, 2, 0.1]);
});

test('score reports malformed lines naming the line number, scores the others, and exits non-zero', () => {
  const r = run(['score', '--reward', 'gsm8k'], '{"solution_str":"#### 1","ground_truth":"1"}\n{"solution_str": 5, "ground_truth":"1"}\n{oops\n');
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /line 2: "solution_str" must be a string/);
  assert.match(r.stderr, /line 3: not JSON/);
  // The good line is still scored (one behaviour for every offline command: see test/cli/offline-jsonl.test.ts).
  assert.deepEqual(r.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { score: number }).score), [1]);
  const bad = run(['score', '--reward', 'gsm8k', '--method', 'loose'], '');
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /--method must be strict or flexible/);
  const unknown = run(['score', '--reward', 'nope'], '{"solution_str":"1","ground_truth":"1"}\n');
  assert.notEqual(unknown.code, 0);
  assert.match(unknown.stderr, /--reward nope: no reward function for that data source \(known: .*gsm8k.*\); a task's own rewards .* need the run's config: --config/);
});

test('advantage --estimator grpo / rloo / gae adds per-token "advantages", 0 where the mask is 0', () => {
  const input = [
    { trajectory_id: 'a', group_id: 'g', reward: 1, response_mask: [1, 1, 0] },
    { trajectory_id: 'b', group_id: 'g', reward: 0, response_mask: [1, 1] },
    { trajectory_id: 'c', group_id: 'h', reward: 0.5, response_mask: [1] },
  ].map((l) => JSON.stringify(l)).join('\n');
  const grpo = run(['advantage', '--estimator', 'grpo'], input);
  assert.equal(grpo.code, 0, grpo.stderr);
  const rows = grpo.stdout.trim().split('\n').map((l) => JSON.parse(l) as { trajectory_id: string; advantages: number[] });
  const a = 0.5 / (Math.SQRT1_2 + 1e-6);
  assert.equal(rows[0]!.trajectory_id, 'a');
  assert.ok(Math.abs(rows[0]!.advantages[0]! - a) < 1e-9 && rows[0]!.advantages[2] === 0);
  assert.ok(Math.abs(rows[1]!.advantages[1]! + a) < 1e-9);
  assert.ok(Math.abs(rows[2]!.advantages[0]! - 0.5 / (1 + 1e-6)) < 1e-9);
  const rloo = run(['advantage', '--estimator', 'rloo'], input);
  assert.deepEqual(rloo.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { advantages: number[] }).advantages), [[1, 1, 0], [-1, -1], [0.5]]);
  const gae = run(['advantage', '--estimator', 'gae', '--gamma', '0.9', '--lambda', '0.95'], input);
  assert.equal(gae.code, 0, gae.stderr);
  assert.equal(gae.stdout.trim().split('\n').length, 3);
});

test('advantage reports malformed lines naming the line number, estimates the others, and exits non-zero', () => {
  const r = run(['advantage', '--estimator', 'grpo'], '{"trajectory_id":"a","group_id":"g","reward":1,"response_mask":[1]}\n{"trajectory_id":"b","group_id":"g","reward":"x","response_mask":[1]}\n{"trajectory_id":"c","group_id":"g","reward":1,"response_mask":[2]}\n');
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /line 2: "reward" must be a finite number/);
  assert.match(r.stderr, /line 3: "response_mask" must be an array of 0 and 1/);
  assert.deepEqual(r.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { trajectory_id: string }).trajectory_id), ['a']);
  const unknown = run(['advantage', '--estimator', 'ppo2'], '');
  assert.notEqual(unknown.code, 0);
  assert.match(unknown.stderr, /unknown advantage estimator "ppo2"/);
});

const CALCULATOR_CONFIG = join(import.meta.dirname, '../../examples/calculator/config.yaml');

test("score --config scores with the run's reward stage: its task's function by data_source, an outside reward as it is", () => {
  const rows = [
    { id: 1, data_source: 'rlstream/calculator', solution_str: 'The answer is 42.', ground_truth: '42' },
    { id: 2, data_source: 'rlstream/calculator', solution_str: 'The answer is 41.', ground_truth: '42' },
    { id: 3, data_source: 'rlstream/calculator', solution_str: 'The answer is 41.', ground_truth: '42', external_reward: 0.25 },
    { id: 4, solution_str: 'The answer is 42.', ground_truth: '42' },
    { id: 5, data_source: 'rlstream/calculator', solution_str: 'x', ground_truth: '42', external_reward: 'high' },
  ].map((l) => JSON.stringify(l)).join('\n');
  const byConfig = run(['score', '--config', CALCULATOR_CONFIG], rows);
  assert.equal(byConfig.code, 1, byConfig.stderr);
  const scores = byConfig.stdout.trim().split('\n').map((l) => JSON.parse(l) as { id: number; score: number });
  assert.deepEqual(scores.map((s) => s.id), [1, 2, 3]);
  assert.equal(scores[0]!.score, 1);
  assert.ok(scores[1]!.score < 1);
  assert.equal(scores[2]!.score, 0.25);
  assert.match(byConfig.stderr, /line 4: "data_source" must be given/);
  assert.match(byConfig.stderr, /line 5: "external_reward" must be a number or null \(got "high"\)/);
  // The task's function named with --reward: rows need no data_source then.
  const named = run(['score', '--reward', 'rlstream/calculator', '--config', CALCULATOR_CONFIG], '{"solution_str":"The answer is 7.","ground_truth":"7"}\n');
  assert.equal(named.code, 0, named.stderr);
  assert.equal((JSON.parse(named.stdout) as { score: number }).score, 1);
  const neither = run(['score'], '');
  assert.notEqual(neither.code, 0);
  assert.match(neither.stderr, /score needs --reward <name> or --config/);
});

test("advantage --config computes each group as the run's advantage stage does: its estimator, options and dynamic sampling", () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-advantage-config-'));
  try {
    const config = join(dir, 'config.yaml');
    writeFileSync(config, 'advantage:\n  estimator: grpo\n  grpo:\n    norm_by_std: false\n  dynamic_sampling: true\n');
    const input = [
      { trajectory_id: 'a', group_id: 'g', reward: 1, response_mask: [1, 0] },
      { trajectory_id: 'b', group_id: 'g', reward: 0, response_mask: [1] },
      { trajectory_id: 'c', group_id: 'h', reward: 0.5, response_mask: [1] },
      { trajectory_id: 'd', group_id: 'h', reward: 0.5, response_mask: [1] },
    ].map((l) => JSON.stringify(l)).join('\n');
    const r = run(['advantage', '--config', config], input);
    assert.equal(r.code, 0, r.stderr);
    // Dr.GRPO (norm_by_std false): reward minus the group mean; group h's equal rewards are left out.
    assert.deepEqual(r.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { advantages: number[] }).advantages), [[0.5, 0], [-0.5]]);
    assert.match(r.stderr, /line 3: group "h" left out by dynamic sampling/);
    assert.match(r.stderr, /2 line\(s\) left out by dynamic sampling/);
    // A flag overrides its key: rloo instead of the config's grpo.
    const rloo = run(['advantage', '--config', config, '--estimator', 'rloo'], input);
    assert.deepEqual(rloo.stdout.trim().split('\n').map((l) => (JSON.parse(l) as { advantages: number[] }).advantages), [[1, 0], [-1]]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
