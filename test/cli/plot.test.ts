// The learning-curves SVG says what it shows: the reward's moving average over the raw per-step values, and
// held-out evaluations on different problem sets drawn apart and named by their set in a legend instead of one
// line through both; the share solved and the mean reward in panels of their own.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lineChartsSvg, movingAverage } from '../../cli/plot.ts';
import { curves } from '../../cli/run/main-job.ts';
import type { Evaluation, TrainStep } from '../../schemas/generated/types.ts';

test('movingAverage: trailing window, shorter at the start', () => {
  const pts = [1, 2, 3, 4, 5].map((y, x) => ({ x, y }));
  assert.deepEqual(movingAverage(pts, 3).map((p) => p.y), [1, 1.5, 2, 3, 4]);
});

test('a smoothed series draws the raw values faint and the moving average on top, with a legend', () => {
  const svg = lineChartsSvg('t', 'step', [{ name: 'reward', points: [0, 1, 0, 1, 0, 1].map((y, x) => ({ x, y })), smooth: 3 }]);
  const paths = [...svg.matchAll(/<path d="([^"]+)" fill="none" ([^/]*)\/>/g)];
  assert.equal(paths.length, 2);
  assert.match(paths[0]![2]!, /stroke-opacity="0.35"/, 'the raw line is faint');
  assert.doesNotMatch(paths[1]![2]!, /stroke-opacity/);
  assert.match(svg, />moving average \(3 steps\)</);
  assert.match(svg, />per step</);
});

function evaluation(step: number, set: string, solved: number, n: number, meanReward: number): Evaluation {
  return { event_id: `e${step}${set}`, time_ms: 0, run_id: 'r', policy_version: step, step, phase: 'periodic', problem_set: set, n, solved, solved_rule: 'task', mean_reward: meanReward, per_difficulty: [], trajectory_ids: [] };
}

test('the main job\'s curves draw each problem set as its own named line, share solved and mean reward apart', () => {
  const step = (n: number): TrainStep => ({ step: n, reward_mean: n % 2, staleness_mean: 1, metrics: [] }) as unknown as TrainStep;
  const evals = [
    evaluation(0, 'calc/heldout[0:200]', 20, 200, 0.5),
    evaluation(10, 'calc/heldout[0:100]', 30, 100, 0.6),
    evaluation(20, 'calc/heldout[0:100]', 25, 100, 0.55),
    evaluation(30, 'calc/heldout[0:200]', 80, 200, 0.7),
  ];
  const svg = curves('r', [1, 2, 3, 4, 5, 6, 7, 8].map(step), evals);
  assert.match(svg, />calc\/heldout\[0:100\]</);
  assert.match(svg, />calc\/heldout\[0:200\]</);
  assert.match(svg, />held-out accuracy \(share solved\), at the evaluated version</);
  assert.match(svg, />held-out mean reward, same evaluations</);
  const orange = [...svg.matchAll(/<path d="([^"]+)" fill="none" stroke="#ff7f0e"/g)];
  assert.equal(orange.length, 2, 'the 100-problem set: one line in each of the two panels');
  assert.equal(orange[0]![1]!.split(/[ML]/).filter(Boolean).length, 2, 'it joins its own two evaluations only');
  // The share solved of the 200-problem line ends at 80/200 = 0.4, not at the mean reward 0.7: the y of its last
  // point is 40% of the way up a 0..1 panel of height 150 whose top is at 230 (panel 2).
  const blue = [...svg.matchAll(/<path d="([^"]+)" fill="none" stroke="#1f77b4" stroke-width/g)];
  const last = blue[1]![1]!.split(/[ML]/).filter(Boolean).at(-1)!.split(',').map(Number);
  assert.ok(Math.abs(last[1]! - (230 + 150 - 0.4 * 150)) < 0.1, `last point at y ${last[1]}`);
});

test('an evaluation without problems draws no point: nothing is plotted that was not measured', () => {
  const svg = curves('r', [], [evaluation(0, 'empty[0:0]', 0, 0, 0)]);
  assert.doesNotMatch(svg, /<circle/);
});
