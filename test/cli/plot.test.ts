// The learning-curves SVG says what it shows: the reward's moving average over the raw per-step values, and
// held-out evaluations of different sizes (all problems before and after RL, the first few during RL) drawn
// apart and named in a legend instead of one line through both.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lineChartsSvg, movingAverage } from '../../cli/plot.ts';
import { curves } from '../../cli/run/main-job.ts';
import type { TrainStep } from '../../schemas/generated/types.ts';

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

test('the main job\'s curves name both held-out sizes and join only evaluations of one size', () => {
  const step = (n: number): TrainStep => ({ step: n, reward_mean: n % 2, staleness_mean: 1, metrics: [] }) as unknown as TrainStep;
  const evals = [
    { step: 0, accuracy: 0.1 },
    { step: 10, accuracy: 0.3 },
    { step: 20, accuracy: 0.25 },
    { step: 30, accuracy: 0.4 },
  ];
  const svg = curves('r', [1, 2, 3, 4, 5, 6, 7, 8].map(step), evals, { full: 200, during: 100 });
  assert.match(svg, />during RL: first 100 problems</);
  assert.match(svg, />before \/ after RL: all 200 problems</);
  const orange = [...svg.matchAll(/<path d="([^"]+)" fill="none" stroke="#ff7f0e"/g)];
  assert.equal(orange.length, 1);
  assert.equal(orange[0]![1]!.split(/[ML]/).filter(Boolean).length, 2, 'the during-RL line joins its two evaluations only');
  assert.equal((svg.match(/r="3.5"/g) ?? []).length, 2, 'before and after are two unjoined points');
  const same = curves('r', [step(1)], evals, { full: 100, during: 100 });
  assert.match(same, />100 problems</);
  assert.doesNotMatch(same, /during RL/);
});
