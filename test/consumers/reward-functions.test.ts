// Rule-based rewards: gsm8k with verl's reference semantics on the real GSM8K answers, math_numeric, the
// registry and module loading, and the composition of components (tool, interaction, shaping).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { extractGsm8kAnswer, gsm8kScore } from '../../core/tasks/gsm8k.ts';
import { extractMathAnswer, mathNumericReward, numericEqual } from '../../core/tasks/math-numeric.ts';
import { RewardRegistry, defaultRewards, loadRewardModule, registerReward } from '../../consumers/reward/registry.ts';
import { composeReward, normalizeOutcome } from '../../consumers/reward/shaping.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { tempDir, trajectory } from '../../testkit/events.ts';

// A sample of the real dataset that ships with the repository (see its README for which rows and why).
const DATA = join(import.meta.dirname, '../fixtures/gsm8k');

function rows(file: string): { answer: string; gt: string }[] {
  return readFileSync(join(DATA, file), 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => {
      const answer = (JSON.parse(l) as { answer: string }).answer;
      // verl's examples/data_preprocess/gsm8k.py: the `#### x` answer with commas removed is the ground truth.
      const gt = /#### (-?[0-9.,]+)/.exec(answer)![1]!.replaceAll(',', '');
      return { answer, gt };
    });
}

test('gsm8k on real GSM8K reference solutions: 1 strict; 1 flexible unless the answer has a thousands comma', () => {
  const all = [...rows('train.jsonl'), ...rows('test.jsonl')];
  assert.ok(all.length >= 60, `the sample has ${all.length} rows`);
  let commas = 0;
  for (const { answer, gt } of all) {
    assert.equal(gsm8kScore(answer, gt, { method: 'strict' }), 1, answer.slice(-80));
    // flexible takes the last number-like string as it is: "1,000" is not "1000" (verl's behaviour, kept).
    const hasComma = /#### -?[0-9.]*,/.test(answer);
    if (hasComma) commas++;
    assert.equal(gsm8kScore(answer, gt, { method: 'flexible', formatScore: 0.1 }), hasComma ? 0.1 : 1, answer.slice(-80));
  }
  // Both branches of the flexible case are exercised: the sample keeps answers with and without a comma.
  assert.ok(commas >= 3 && commas < all.length, `${commas} of ${all.length} answers have a comma`);
});

test('gsm8k on perturbed GSM8K solutions: a wrong number scores format_score, no answer scores 0', () => {
  for (const { answer, gt } of [...rows('train.jsonl'), ...rows('test.jsonl')]) {
    const wrong = answer.replace(/#### .*$/, `#### ${Number(gt) + 1}`);
    for (const method of ['strict', 'flexible'] as const) {
      assert.equal(gsm8kScore(wrong, gt, { method, formatScore: 0.25 }), 0.25, `${method}: ${wrong.slice(-60)}`);
      assert.equal(gsm8kScore(wrong, gt, { method }), 0);
    }
    const unmarked = answer.replace(/\n#### .*$/, '');
    assert.equal(gsm8kScore(unmarked, gt, { method: 'strict', formatScore: 0.25 }), 0);
    assert.equal(gsm8kScore('I do not know', gt, { method: 'flexible', formatScore: 0.25 }), 0);
    // verl's quirk: a lone "." is a flexible match when nothing better exists, so it scores format_score.
    assert.equal(gsm8kScore('I do not know.', gt, { method: 'flexible', formatScore: 0.25 }), 0.25);
  }
});

test('gsm8k extraction details match verl', () => {
  assert.equal(extractGsm8kAnswer('#### 1,234', 'strict'), '1234');
  assert.equal(extractGsm8kAnswer('#### 5 then #### 7', 'strict'), '7'); // the last one
  assert.equal(extractGsm8kAnswer('####7', 'strict'), null); // the space is required
  assert.equal(extractGsm8kAnswer('#### -3.5', 'strict'), '-3.5');
  assert.equal(extractGsm8kAnswer('The answer is 1,234.', 'flexible'), '1,234.'); // taken as it is
  assert.equal(extractGsm8kAnswer('5 apples. .', 'flexible'), '5');
  assert.equal(extractGsm8kAnswer('. .', 'flexible'), '.'); // verl's loop variable quirk
  assert.equal(extractGsm8kAnswer('no digits', 'flexible'), null);
  // Only the last 300 characters are searched.
  assert.equal(extractGsm8kAnswer('#### 42' + 'x'.repeat(300), 'strict'), null);
  assert.equal(extractGsm8kAnswer('#### 42' + 'x'.repeat(293), 'strict'), '42');
  assert.equal(gsm8kScore('#### 42', '42', { score: 2 }), 2);
});

test('math_numeric compares values: 18.00 = 18, fractions, thousands commas, \\boxed', () => {
  assert.ok(numericEqual('18.00', '18'));
  assert.ok(numericEqual('1,800', '1800'));
  assert.ok(numericEqual('36/2', '18'));
  assert.ok(numericEqual('\\frac{3}{4}', '0.75'));
  assert.ok(numericEqual('$5', '5'));
  assert.ok(numericEqual('-0.5', '-1/2'));
  assert.ok(!numericEqual('18.01', '18'));
  assert.ok(!numericEqual('abc', '18'));
  assert.equal(extractMathAnswer('so \\boxed{\\frac{1}{2}} done'), '\\frac{1}{2}');
  assert.equal(extractMathAnswer('it is 12 then 18.00'), '18.00');
  const fn = mathNumericReward({ formatScore: 0.1 });
  assert.deepEqual(fn('math', 'The total is #### 18.00', '18', {}), { score: 1, correct: true });
  assert.deepEqual(fn('math', 'The total is #### 17', '18', {}), { score: 0.1, correct: false });
  assert.deepEqual(fn('math', 'no idea', '18', {}), { score: 0, correct: false });
});

test('registerReward is one call; the registry names what it has when a data_source is missing', () => {
  registerReward('calc_test', () => 0.5);
  assert.equal(defaultRewards.get('calc_test')!('calc_test', '', '', {}), 0.5);
  const r = new RewardRegistry();
  assert.throws(() => r.require('nope'), (e: unknown) => isRlstreamError(e, 'REWARD_FAILED') && /no reward function for data_source "nope"/.test(e.message));
});

test('a user reward module is loaded by path and export name', async () => {
  const dir = tempDir('rm');
  writeFileSync(join(dir, 'my_reward.mjs'), 'export function score(ds, sol, gt) { return { score: sol.includes(gt) ? 1 : 0, correct: sol.includes(gt) }; }\n');
  const fn = await loadRewardModule('my_reward.mjs', 'score', dir);
  assert.deepEqual(await fn('x', 'has 42', '42', {}), { score: 1, correct: true });
  await assert.rejects(loadRewardModule('my_reward.mjs', 'missing', dir), /reward\.export: my_reward\.mjs has no export "missing" \(exports: score\)/);
  await assert.rejects(loadRewardModule('nope.mjs', 'score', dir), /reward\.module: \S+nope\.mjs does not exist/);
});

test('outcome validation: NaN / Inf → REWARD_NON_FINITE; components must sum to the score', () => {
  assert.throws(() => normalizeOutcome(NaN, 'f'), (e: unknown) => isRlstreamError(e, 'REWARD_NON_FINITE'));
  assert.throws(() => normalizeOutcome({ score: Infinity }, 'f'), (e: unknown) => isRlstreamError(e, 'REWARD_NON_FINITE'));
  assert.throws(() => normalizeOutcome({ score: 1, components: { a: NaN } }, 'f'), (e: unknown) => isRlstreamError(e, 'REWARD_NON_FINITE'));
  assert.throws(() => normalizeOutcome({ score: 1, components: { a: 0.5 } }, 'f'), /summing to 0.5, not its score 1/);
  assert.throws(() => normalizeOutcome('1' as unknown as number, 'f'), (e: unknown) => isRlstreamError(e, 'REWARD_FAILED'));
  assert.deepEqual(normalizeOutcome({ score: 1, components: { fmt: 0.2, answer: 0.8 }, correct: true }, 'f').components, [
    { name: 'fmt', value: 0.2 },
    { name: 'answer', value: 0.8 },
  ]);
});

test('components: outcome, tool and interaction rewards, shaping; the score is their sum', () => {
  const t = { ...trajectory({ groupId: 'g', index: 0 }), tool_rewards: [0.1, 0.2], interaction_rewards: [0.5], num_tool_calls: 4, num_tool_errors: 1, num_invalid_tool_calls: 1, termination: 'max_turns' as const };
  const info = composeReward(t, normalizeOutcome({ score: 1, correct: true }, 'f'), 'gsm8k', { toolSuccessBonus: 0.05, invalidCallPenalty: 0.1, maxTurnsPenalty: 0.3 });
  const byName = Object.fromEntries(info.components.map((c) => [c.name, c.value]));
  assert.deepEqual(Object.keys(byName), ['outcome', 'tool', 'interaction', 'shaping.tool_success', 'shaping.invalid_call', 'shaping.max_turns']);
  assert.ok(Math.abs(byName['tool']! - 0.3) < 1e-12);
  assert.equal(byName['shaping.tool_success'], 0.1); // 2 successful calls
  assert.equal(byName['shaping.invalid_call'], -0.2); // 1 error + 1 invalid
  assert.equal(byName['shaping.max_turns'], -0.3);
  assert.ok(Math.abs(info.score - (1 + 0.3 + 0.5 + 0.1 - 0.2 - 0.3)) < 1e-12);
  assert.equal(info.correct, true);
  assert.equal(info.reward_fn, 'gsm8k');
});
