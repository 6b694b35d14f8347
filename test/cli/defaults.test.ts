// One default per setting: the C++ loss options have none (the glue passes every value), the trainer's loss options
// are compiled once with the config and a micro-batch only scales them, the run's staleness bound has one default
// at both ends of the gate, and the estimators' options are per-name sections whose names come from the registry.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { compileRunConfig, ConfigError } from '../../cli/config/run-config.ts';
import { AdvantageSection } from '../../cli/config/sections.ts';
import { DEFAULT_ESTIMATOR_OPTIONS, estimators } from '../../consumers/advantage/estimators.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { policyLosses } from '../../consumers/trainer/policy-losses.ts';
import { DEFAULT_STALENESS_BOUND } from '../../core/staleness.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { compilePolicyLossOptions, POLICY_LOSS_DEFAULTS, withLossScale } from '../../native/model.ts';
import { RolloutSection } from '../../producers/options.ts';

const ROOT = join(import.meta.dirname, '../..');
const read = (p: string) => readFileSync(join(ROOT, p), 'utf8');
const withoutComments = (s: string) => s.replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '');

/** The member declarations of a C++ struct, comments removed, one per `;`. */
function structMembers(source: string, name: string): string[] {
  const m = new RegExp(`struct\\s+${name}\\s*\\{([\\s\\S]*?)\\n\\};`).exec(withoutComments(source));
  assert.ok(m, `struct ${name} not found`);
  return m[1]!.split(';').map((d) => d.trim()).filter(Boolean);
}

test('native PolicyLossOptions has no default member: a C++ default cannot disagree with the TypeScript one', () => {
  const members = structMembers(read('native/src/losses.h'), 'PolicyLossOptions');
  assert.ok(members.length >= 12, `only ${members.length} members parsed`);
  const withDefault = members.filter((d) => /=|\{/.test(d));
  assert.deepEqual(withDefault, [], 'members with a default initializer');
});

test('the glue sets every PolicyLossOptions field from the options it is given', () => {
  const fields = structMembers(read('native/src/losses.h'), 'PolicyLossOptions').flatMap((d) => d.replace(/^\S+\s+/, '').split(',').map((f) => f.trim()));
  const glue = withoutComments(read('native/src/glue_model.cpp'));
  const body = glue.slice(glue.indexOf('PolicyLossOptions opt;'), glue.indexOf('std::make_shared<PolicyLoss>'));
  assert.ok(body.length > 0, 'backwardPolicyLoss glue not found');
  const unset = fields.filter((f) => !new RegExp(`opt\\.${f}\\s*=`).test(body));
  assert.deepEqual(unset, [], 'fields the glue leaves unset');
});

test("each loss's options default once: the compiled trainer options carry its schema's defaults and the shared ones", () => {
  for (const name of policyLosses.names()) {
    const t = compileTrainerOptions({ policy_loss: name });
    const props = policyLosses.get(name).options.properties as Record<string, { default?: unknown }>;
    assert.equal(t.lossOptions.loss, name);
    assert.equal(t.lossOptions.clipLow, props['clip_low']!.default, `${name}.clip_low`);
    assert.equal(t.lossOptions.clipHigh, props['clip_high']!.default, `${name}.clip_high`);
    assert.equal(t.lossOptions.dualClipC, (props['dual_clip_c']?.default as number | null | undefined) ?? 0, `${name}.dual_clip_c`);
    assert.deepEqual([t.lossOptions.klCoef, t.lossOptions.klType, t.lossOptions.entropyCoef, t.lossOptions.aggregation], [POLICY_LOSS_DEFAULTS.klCoef, POLICY_LOSS_DEFAULTS.klType, POLICY_LOSS_DEFAULTS.entropyCoef, POLICY_LOSS_DEFAULTS.aggregation]);
    assert.deepEqual([t.lossOptions.correction, t.lossOptions.correctionLevel, t.lossOptions.iwCap], [POLICY_LOSS_DEFAULTS.correction.mode, POLICY_LOSS_DEFAULTS.correction.level, POLICY_LOSS_DEFAULTS.correction.cap]);
  }
  // The native API without a value takes the same shared defaults.
  const api = compilePolicyLossOptions({ clipLow: 0.2, clipHigh: 0.28, dualClipC: 3 });
  const trainer = compileTrainerOptions({}).lossOptions;
  assert.deepEqual({ ...api }, { ...trainer });
  // ppo's clip_high is 0.28 (DAPO clip-higher), wherever it is read.
  assert.equal(trainer.clipHigh, 0.28);
});

test('loss options are compiled once: a micro-batch only sets its scale, and only compiled options are scaled', () => {
  const compiled = compileTrainerOptions({ kl_coef: 0.1 }).lossOptions;
  const scaled = withLossScale(compiled, 0.25);
  assert.ok(Object.isFrozen(scaled));
  assert.deepEqual({ ...scaled, lossScale: compiled.lossScale }, { ...compiled });
  assert.equal(scaled.lossScale, 0.25);
  // A copy the compiler did not make, or a bad scale, is refused rather than passed to the native side.
  assert.throws(() => withLossScale({ ...compiled }, 1), (e: unknown) => isRlstreamError(e) && /withLossScale takes options from compilePolicyLossOptions/.test(e.message));
  for (const bad of [-1, Number.NaN, Infinity]) assert.throws(() => withLossScale(compiled, bad), /lossScale must be a finite number >= 0/);
  // An invalid combination fails at config compilation, naming the section, not at the first step.
  assert.throws(() => compileTrainerOptions({ policy_loss: 'cispo', cispo: { clip_low: 1 }, rollout_correction: { mode: 'mask', low: 1, high: 1 } }), ConfigError);
});

test("the run's staleness bound has one default at both ends of the gate", () => {
  // The rollout section has neither the bound nor groups per step: the worker is given the trainer's
  // (cli/run/roles.ts rolloutOptions; test/cli/rollout-options.test.ts).
  assert.ok(!('staleness_bound' in RolloutSection.properties) && !('groups_per_step' in RolloutSection.properties));
  assert.equal(compileTrainerOptions({}).stalenessBound, DEFAULT_STALENESS_BOUND);
  assert.equal(compileRunConfig({}, '/tmp').trainer.stalenessBound, DEFAULT_STALENESS_BOUND);
});

test('estimators: per-name option sections, their names from the registry, each option defaulted once', () => {
  const props = AdvantageSection.properties as Record<string, { properties?: Record<string, { default?: unknown }>; description?: string }>;
  for (const name of estimators.names()) {
    assert.ok(props[name], `advantage.${name} section`);
    assert.match(props['estimator']!.description!, new RegExp(`\\b${name}\\b`));
  }
  assert.deepEqual(Object.keys(props['grpo']!.properties!).sort(), ['epsilon', 'norm_by_std']);
  assert.deepEqual(Object.keys(props['gae']!.properties!).sort(), ['gamma', 'lam']);
  assert.equal(props['gae']!.properties!['gamma']!.default, DEFAULT_ESTIMATOR_OPTIONS.gamma);
  const c = compileRunConfig({ advantage: { estimator: 'gae', gae: { gamma: 0.9, lam: 0.95 }, grpo: { norm_by_std: false } } }, '/tmp').advantage;
  assert.deepEqual(c.options['gae'], { ...DEFAULT_ESTIMATOR_OPTIONS, gamma: 0.9, lam: 0.95 });
  assert.equal(c.options['grpo']!.normByStd, false);
  // The flat keys of before, and an option the estimator does not read, fail naming the path.
  const issues = (raw: unknown) => {
    try {
      compileRunConfig(raw, '/tmp');
    } catch (e) {
      if (e instanceof ConfigError) return e.issues.map((i) => i.path);
      throw e;
    }
    return [];
  };
  assert.ok(issues({ advantage: { gamma: 0.9 } }).some((p) => p.startsWith('advantage')), 'advantage.gamma is no key');
  assert.ok(issues({ advantage: { grpo: { lam: 0.5 } } }).some((p) => p.startsWith('advantage.grpo')), 'grpo reads no lam');
  // No estimator name is written out where the registry answers.
  for (const file of ['cli/config/sections.ts', 'consumers/advantage/consumer.ts', 'consumers/advantage/stage.ts', 'cli/config/run-config.ts']) {
    const src = withoutComments(read(file));
    for (const name of estimators.names().filter((n) => n !== 'grpo')) assert.ok(!src.includes(`'${name}'`), `${file} names ${name}`);
  }
});
