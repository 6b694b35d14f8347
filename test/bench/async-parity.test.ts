// The sync-vs-async parity study (bench/async-parity.ts): every objective it can compare is a valid run config of
// the calculator example (a renamed or removed trainer key would otherwise surface only when the 45-minute study
// fails at its first run), and its summary is the mean and sample standard deviation over seeds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { SETTINGS, meanSd } from '../../bench/async-parity.ts';

const CONFIG = join(import.meta.dirname, '..', '..', 'examples', 'calculator', 'config.yaml');

test('every setting of the parity study compiles on the calculator example, with the loss and correction it names', () => {
  assert.ok('ppo' in SETTINGS, 'the current objective is one of the settings');
  for (const [name, overrides] of Object.entries(SETTINGS)) {
    const c = loadRunConfig(CONFIG, { ...overrides, 'trainer.staleness_bound': 4 });
    assert.equal(c.trainer.policyLoss.name, overrides['trainer.policy_loss'], name);
    const correction = overrides['trainer.rollout_correction'] as { mode: string } | undefined;
    assert.equal(c.trainer.rolloutCorrection.mode, correction?.mode ?? 'truncate', name);
  }
});

test('meanSd: the mean and the sample standard deviation, non-finite values left out', () => {
  assert.deepEqual(meanSd([3, 4, 5, NaN]), { n: 3, mean: 4, sd: 1 });
  assert.deepEqual(meanSd([0.25]), { n: 1, mean: 0.25, sd: 0 });
  assert.equal(meanSd([]).n, 0);
});
