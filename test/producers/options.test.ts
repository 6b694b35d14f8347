// The rollout section: its schema holds each default once (the compiled config is derived from it, key by key),
// every bad value fails naming its config path, the same through `config check`, and the worker's options are the
// compiled section completed in a fixed order: the section's value, then the model's, then SAMPLING_FALLBACK.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { TSchema } from '@sinclair/typebox';
import { compileRunConfig } from '../../cli/config/run-config.ts';
import { ConfigError } from '../../core/config/validate.ts';
import { toolParserNames } from '../../producers/agent/tool-parser.ts';
import { compileRolloutSection, completeRolloutOptions, RolloutSection, SAMPLING_FALLBACK, type RolloutRun } from '../../producers/options.ts';

type Prop = { type?: string | string[]; default?: unknown; minimum?: number; exclusiveMinimum?: number; maximum?: number; enum?: unknown[]; properties?: Record<string, Prop> };

const camel = (k: string) => k.replace(/_([a-z])/g, (_m, c: string) => c.toUpperCase());

/** Every leaf key of the section with its schema, as dotted config paths below `rollout`. */
function leaves(props: Record<string, TSchema>, prefix = ''): [string, Prop][] {
  return Object.entries(props).flatMap(([k, s]) => {
    const p = s as Prop;
    return p.properties && p.type === 'object' ? leaves(p.properties as Record<string, TSchema>, `${prefix}${k}.`) : [[`${prefix}${k}`, p] as [string, Prop]];
  });
}

/** A raw section with `value` at the dotted `path`. */
function at(path: string, value: unknown): Record<string, unknown> {
  const parts = path.split('.');
  const root: Record<string, unknown> = {};
  let node = root;
  for (const p of parts.slice(0, -1)) node = (node[p] = {}) as Record<string, unknown>;
  node[parts[parts.length - 1]!] = value;
  return root;
}

/**
 * What each key accepts, written here by hand (not read from the schema, so a schema that loosens a key fails
 * this test): the kind of value and whether null is allowed.
 */
const KINDS: Record<string, { kind: 'posInt' | 'nonNegInt' | 'int' | 'nonNegNumber' | 'unitInterval' | 'enum' | 'nonEmptyString' | 'idList' | 'mapping'; nullable?: boolean }> = {
  n: { kind: 'posInt' },
  concurrency: { kind: 'posInt' },
  max_inflight_trajectories: { kind: 'posInt', nullable: true },
  max_assistant_turns: { kind: 'posInt' },
  max_user_turns: { kind: 'posInt' },
  response_length: { kind: 'posInt' },
  max_parallel_tool_calls: { kind: 'posInt' },
  max_tool_errors: { kind: 'posInt' },
  tokenization_check: { kind: 'enum' },
  tokenization_check_every: { kind: 'posInt' },
  tool_parser: { kind: 'enum', nullable: true },
  default_agent: { kind: 'nonEmptyString' },
  agent_loops: { kind: 'mapping' },
  interactions: { kind: 'mapping' },
  'sampling.temperature': { kind: 'nonNegNumber', nullable: true },
  'sampling.top_p': { kind: 'unitInterval', nullable: true },
  'sampling.top_k': { kind: 'nonNegInt', nullable: true },
  'sampling.max_new_tokens': { kind: 'posInt', nullable: true },
  'sampling.seed': { kind: 'int', nullable: true },
  'sampling.stop_token_ids': { kind: 'idList' },
  interrupt: { kind: 'enum' },
  epochs: { kind: 'posInt', nullable: true },
  split: { kind: 'nonEmptyString' },
  template_kwargs: { kind: 'mapping' },
  poll_interval_ms: { kind: 'posInt' },
};

/** Values a key of this kind must refuse. */
function badValues(k: (typeof KINDS)[string]): unknown[] {
  const common: unknown[] = [true, { not: 'a scalar' }, ...(k.nullable ? [] : [null])];
  switch (k.kind) {
    case 'posInt':
      return [...common, 0, -1, 1.5, '8', [8]];
    case 'nonNegInt':
      return [...common, -1, 0.5, '8', [8]];
    case 'int':
      return [...common, 0.5, '8', [8]];
    case 'nonNegNumber':
      return [...common, -0.1, '1', [1]];
    case 'unitInterval':
      return [...common, 0, -0.5, 1.01, '1', [1]];
    case 'enum':
      return [...common, 'no-such-name', '', 3, ['hermes']];
    case 'nonEmptyString':
      return [...common, '', 3, ['x']];
    case 'idList':
      return [true, null, 3, 'x', [-1], [1.5], ['1'], [null]];
    case 'mapping':
      return [true, null, 3, 'x', ['x']];
  }
}

const RUN: RolloutRun = { groupsPerStep: 3, stalenessBound: 2, datasetName: 'ds', model: { toolParser: 'llama3_json', temperature: 0.6, topP: 0.95, topK: 20, stopTokenIds: [7, 9] } };

test('each default exists once, in the schema: the compiled section is the schema defaults, key by key', () => {
  const c = compileRolloutSection({}) as unknown as Record<string, unknown>;
  let compared = 0;
  for (const [path, p] of leaves(RolloutSection.properties as Record<string, TSchema>)) {
    if (p.default === undefined || p.default === null) continue;
    const parts = path.split('.');
    // sampling keeps the contract's names (SamplingParams); the section's other keys are camelCase.
    const got = parts[0] === 'sampling' ? (c['sampling'] as Record<string, unknown>)[parts[1]!] : c[camel(path)];
    assert.deepEqual(got, p.default, `rollout.${path}`);
    compared++;
  }
  assert.ok(compared >= 15, `only ${compared} defaults compared`);
  // The keys whose null default is derived: from other keys here, or later from the model.
  const d = compileRolloutSection({ concurrency: 5, response_length: 77 });
  assert.equal(d.maxInflightTrajectories, 10);
  assert.equal(d.sampling.max_new_tokens, 77);
  assert.deepEqual([d.toolParser, d.sampling.temperature, d.sampling.top_p, d.sampling.top_k, d.sampling.stop_token_ids], [null, null, null, null, null]);
  // Every compiled key comes from a schema key (nothing defaulted outside it).
  const keys = new Set(Object.keys(RolloutSection.properties).map(camel));
  for (const k of Object.keys(c)) assert.ok(keys.has(k), `compiled key ${k} has no schema key`);
});

test('every bad value of every key fails naming rollout.<path>, alone and through config check', () => {
  // The table covers the section: a new key needs its kind written down above.
  assert.deepEqual(leaves(RolloutSection.properties as Record<string, TSchema>).map(([p]) => p).sort(), Object.keys(KINDS).sort());
  let cases = 0;
  const named = (path: string) => (e: unknown) => e instanceof ConfigError && e.issues.some((i) => i.path === `rollout.${path}` || i.path.startsWith(`rollout.${path}[`) || i.path.startsWith(`rollout.${path}.`));
  for (const [path, kind] of Object.entries(KINDS)) {
    for (const bad of badValues(kind)) {
      const raw = at(path, bad);
      const what = `rollout.${path} = ${JSON.stringify(bad)}`;
      assert.throws(() => compileRolloutSection(raw), named(path), what);
      assert.throws(() => compileRunConfig({ rollout: raw }, '/tmp'), named(path), `config check: ${what}`);
      cases++;
    }
  }
  assert.ok(cases >= 150, `only ${cases} cases generated`);
});

test('hand-written bad sections: the message names the path and the fix', () => {
  const message = (raw: unknown) => {
    try {
      compileRolloutSection(raw);
    } catch (e) {
      if (e instanceof ConfigError) return e.message;
      throw e;
    }
    assert.fail(`${JSON.stringify(raw)} compiled`);
  };
  assert.equal(message({ sampling: { top_p: 2 } }), 'rollout.sampling.top_p: must be <= 1 (got 2)');
  assert.equal(message({ sampling: { top_p: 0 } }), 'rollout.sampling.top_p: must be > 0 (got 0)');
  assert.equal(message({ n: 1.5 }), 'rollout.n: must be an integer (got 1.5)');
  assert.equal(message({ max_assistant_turns: 0 }), 'rollout.max_assistant_turns: must be >= 1 (got 0)');
  assert.match(message({ tokenization_check: 'loose' }), /^rollout\.tokenization_check: must be one of ignore_strippable, strict, off \(got "loose"\)/);
  assert.match(message({ max_turns: 3 }), /^rollout\.max_turns: unknown key \(known: n, concurrency, .*max_assistant_turns, max_user_turns/);
  assert.match(message({ max_user_turn: 3 }), /^rollout\.max_user_turn: unknown key \(did you mean max_user_turns\?\)/);
  // The gate's numbers are the trainer's: the fix says where they are set.
  assert.equal(message({ staleness_bound: 1 }), 'rollout.staleness_bound: unknown key: the staleness bound is set once, as trainer.staleness_bound');
  assert.equal(message({ groups_per_step: 2 }), 'rollout.groups_per_step: unknown key: groups per step is set once, as trainer.groups_per_step');
  // Tool parsers by the registry's names.
  assert.equal(message({ tool_parser: 'qwen_xml' }), `rollout.tool_parser: must be one of ${[...toolParserNames(), 'null'].join(', ')} (got "qwen_xml")`);
  assert.equal(message({ sampling: { stop_token_ids: [1, -2] } }), 'rollout.sampling.stop_token_ids[1]: must be >= 0 (got -2)');
  assert.equal(message('rollout'), 'rollout: must be a mapping (got "rollout")');
  // Every issue at once.
  assert.equal(message({ n: 0, concurrency: 0, sampling: { seed: 'x' } }).split('\n').length, 3);
});

test('the worker options: the section first, then the model, then the fallback; the gate and dataset from the run', () => {
  const section = compileRolloutSection({ sampling: { temperature: 0.3 }, n: 4 });
  const o = completeRolloutOptions(section, RUN);
  assert.deepEqual(o.sampling, { temperature: 0.3, top_p: 0.95, top_k: 20, max_new_tokens: 1024, seed: null, stop_token_ids: [7, 9] });
  assert.deepEqual([o.toolParser, o.groupsPerStep, o.stalenessBound, o.datasetName, o.n], ['llama3_json', 3, 2, 'ds', 4]);
  assert.ok(Object.isFrozen(o) && Object.isFrozen(o.sampling) && Object.isFrozen(o.sampling.stop_token_ids));
  // The run's config never reaches the worker's options: not the plug-ins, not the backend's interrupt mode.
  for (const k of ['agentLoops', 'interactions', 'interrupt']) assert.ok(!(k in o), k);
  // A model without defaults: the fallback.
  const bare = completeRolloutOptions(compileRolloutSection({}), { ...RUN, model: { toolParser: 'hermes', temperature: null, topP: null, topK: null, stopTokenIds: [] } });
  assert.deepEqual([bare.sampling.temperature, bare.sampling.top_p, bare.sampling.top_k], [SAMPLING_FALLBACK.temperature, SAMPLING_FALLBACK.top_p, SAMPLING_FALLBACK.top_k]);
  // The section's values win over the model's, 0 and empty lists included.
  const explicit = completeRolloutOptions(compileRolloutSection({ tool_parser: 'mistral', sampling: { temperature: 0, top_k: 0, stop_token_ids: [] } }), RUN);
  assert.deepEqual([explicit.toolParser, explicit.sampling.temperature, explicit.sampling.top_k, explicit.sampling.stop_token_ids], ['mistral', 0, 0, []]);
  // A model parser that is not registered is a bug in the caller, not a config error.
  assert.throws(() => completeRolloutOptions(section, { ...RUN, model: { ...RUN.model, toolParser: 'nope' } }), /tool-call parser "nope" is not registered/);
});
