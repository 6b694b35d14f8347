// The trainer's policy-loss options: `trainer.policy_loss` names a registered loss whose options are its own
// section, the default compiles to the PPO objective the trainer always had, and a misspelt loss, an option of
// another loss or an empty mask window fails naming the field.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { policyLosses } from '../../consumers/trainer/policy-losses.ts';
import { compileRunConfig } from '../../cli/config/run-config.ts';
import { trainerIssues } from './fixtures/synthetic.ts';


test('the default policy loss is ppo with the clip, dual clip and truncated weight the trainer has always used', () => {
  const t = compileTrainerOptions({});
  assert.deepEqual(t.policyLoss, { name: 'ppo', loss: 'ppo', clipLow: 0.2, clipHigh: 0.28, dualClipC: 3 });
  assert.deepEqual(t.rolloutCorrection, { mode: 'truncate', level: 'token', cap: 2 });
});

test('each registered loss compiles from its own section', () => {
  assert.deepEqual(policyLosses.names(), ['cispo', 'gspo', 'ppo']);
  const g = compileTrainerOptions({ policy_loss: 'gspo', gspo: { clip_high: 5e-4 } });
  assert.deepEqual(g.policyLoss, { name: 'gspo', loss: 'gspo', clipLow: 3e-4, clipHigh: 5e-4, dualClipC: null });
  const c = compileTrainerOptions({ policy_loss: 'cispo', rollout_correction: { mode: 'mask', level: 'sequence', low: 0.5, high: 1.5 } });
  assert.deepEqual(c.policyLoss, { name: 'cispo', loss: 'cispo', clipLow: 1, clipHigh: 0.28, dualClipC: null });
  assert.deepEqual(c.rolloutCorrection, { mode: 'mask', level: 'sequence', low: 0.5, high: 1.5 });
  assert.deepEqual(compileTrainerOptions({ rollout_correction: { mode: 'off' } }).rolloutCorrection, { mode: 'off' });
});

test('a misspelt loss, an option of another loss and an empty mask window fail naming the field', () => {
  assert.deepEqual(trainerIssues({ policy_loss: 'gspoo' }), ['trainer.policy_loss: must be one of cispo, gspo, ppo (got "gspoo") (did you mean gspo?)']);
  const other = trainerIssues({ policy_loss: 'gspo', gspo: { dual_clip_c: 3 } });
  assert.equal(other.length, 1);
  assert.match(other[0]!, /^trainer\.gspo\.dual_clip_c: /);
  assert.match(trainerIssues({ clip_low: 0.1 }).join('\n'), /trainer\.clip_low: .*trainer\.ppo\.clip_low/);
  assert.throws(() => compileRunConfig({ trainer: { rollout_correction: { mode: 'mask', low: 2, high: 1 } } }, '/tmp'), /trainer\.rollout_correction: low \(2\) must be below high \(1\)/);
});
