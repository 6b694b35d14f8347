// The compiled run config: every section refuses an unknown key and a wrong type naming the path, plug-in
// names are checked with a suggestion, the shaping terms written in YAML change rewards by their amounts,
// and `rlstream config check` passes on every shipped config and lists every problem of a bad one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { compileRunConfig, ConfigError } from '../../cli/config/run-config.ts';
import { composeReward } from '../../consumers/reward/shaping.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { compileRolloutSection } from '../../producers/options.ts';
import { trajectory } from '../../testkit/events.ts';
import { checkConfig } from '../../cli/run/preflight.ts';

const ROOT = join(import.meta.dirname, '..', '..');

function issues(raw: Record<string, unknown>): string[] {
  try {
    compileRunConfig(raw, '/tmp');
  } catch (err) {
    assert.ok(err instanceof ConfigError, String(err));
    return err.issues.map((i) => `${i.path}: ${i.message}`);
  }
  return [];
}

// One known key per section, with a value of the wrong type.
const SECTIONS: [string, Record<string, unknown>, string, unknown][] = [
  ['run', {}, 'seed', 'one'],
  ['log', { kind: 'embedded' }, 'dir', 5],
  ['registry', { kind: 'http', url: 'http://x' }, 'url', 5],
  ['traces', { kind: 'chdb' }, 'batch_rows', 'many'],
  ['admin', {}, 'port', 'eighty'],
  ['serve', {}, 'max_sessions', 'many'],
  ['model', {}, 'config', 7],
  ['task', { name: 'calculator' }, 'heldout_problems', 'all'],
  ['dataset', {}, 'train', 3],
  ['sft', {}, 'steps', 'ten'],
  ['rollout', {}, 'n', 'eight'],
  ['backend', { name: 'builtin' }, 'workers', 'two'],
  ['tools', {}, 'config', 1],
  ['reward', {}, 'shaping', 'on'],
  ['advantage', {}, 'group_timeout_ms', 'soon'],
  ['trainer', {}, 'learning_rate', 'fast'],
  ['eval', {}, 'every_steps', 'often'],
];

test('every section refuses an unknown key and a wrong type, naming the path', () => {
  for (const [section, base, key, bad] of SECTIONS) {
    const unknown = issues({ [section]: { ...base, [`${key}x`]: 1 } });
    assert.ok(unknown.some((m) => m.startsWith(`${section}.${key}x: unknown key (did you mean ${key}?)`)), `${section}: ${unknown.join(' | ')}`);
    const wrong = issues({ [section]: { ...base, [key]: bad } });
    assert.ok(wrong.some((m) => m.startsWith(`${section}.${key}: must be`)), `${section}: ${wrong.join(' | ')}`);
  }
  assert.deepEqual(issues({ polices: {} }).map((m) => m.split(' (')[0]), ['polices: unknown key']);
});

test('every problem is reported at once; enum values and plug-in names get a suggestion', () => {
  const all = issues({
    advantage: { partial_groups: 'dorp', estimator: 'grpoo' },
    reward: { shaping: { tool_sucess_bonus: 0.1 } },
    task: { name: 'calculator', train: 'nightmare' },
    backend: { name: 'buildin' },
    rollout: { staleness_bound: 3 },
  });
  assert.ok(all.includes('advantage.partial_groups: must be one of emit, drop (got "dorp") (did you mean drop?)'), all.join('\n'));
  assert.ok(all.some((m) => m.startsWith('advantage.estimator: unknown advantage estimator "grpoo" (did you mean grpo?)')), all.join('\n'));
  assert.ok(all.some((m) => m.startsWith('reward.shaping.tool_sucess_bonus: unknown key (did you mean tool_success_bonus?)')), all.join('\n'));
  assert.ok(all.includes('task.train: must be one of easy, medium, hard (got "nightmare")'), all.join('\n'));
  assert.ok(all.some((m) => m.startsWith('backend.name: unknown LLM backend "buildin" (did you mean builtin?)')), all.join('\n'));
  assert.ok(all.some((m) => m.startsWith('rollout.staleness_bound: unknown key: the staleness bound is set once, as trainer.staleness_bound')), all.join('\n'));
  assert.equal(all.length, 6);
  assert.ok(issues({ task: { name: 'calculatr' } }).some((m) => m.includes('unknown task "calculatr" (did you mean calculator?)')));
  assert.ok(issues({ trainer: { staleness_bound: -1 } }).includes('trainer.staleness_bound: must be >= 0 (got -1)'));
});

test('the compiled config is frozen and fully specified; schema defaults are the roles\' defaults', () => {
  const c = compileRunConfig({}, '/tmp');
  assert.ok(Object.isFrozen(c) && Object.isFrozen(c.trainer) && Object.isFrozen(c.rollout) && Object.isFrozen(c.rollout.sampling));
  assert.deepEqual(c.trainer, compileTrainerOptions({}));
  assert.deepEqual(c.rollout, compileRolloutSection({}));
  assert.equal(c.advantage.partialGroups, 'emit');
  assert.deepEqual(c.reward.shaping, { toolSuccessBonus: 0, invalidCallPenalty: 0, maxTurnsPenalty: 0, overlongBufferLen: 0, overlongPenaltyFactor: 1, maxResponseLength: c.rollout.responseLength, maskTruncated: false });
});

test('reward.shaping in YAML changes rewards by the configured amounts', () => {
  const shaping = compileRunConfig({ reward: { shaping: { tool_success_bonus: 0.1, invalid_call_penalty: 0.25, max_turns_penalty: 0.5 } } }, '/tmp').reward.shaping;
  const none = compileRunConfig({}, '/tmp').reward.shaping;
  const t = { ...trajectory({ groupId: 'g', index: 0 }), num_tool_calls: 5, num_tool_errors: 1, num_invalid_tool_calls: 1, termination: 'max_turns' as const };
  const outcome = { components: [{ name: 'outcome', value: 1 }], correct: true };
  const base = composeReward(t, outcome, 'f', none);
  const shaped = composeReward(t, outcome, 'f', shaping);
  assert.equal(base.score, 1);
  const by = (name: string) => shaped.components.find((c) => c.name === name)?.value;
  assert.ok(Math.abs(by('shaping.tool_success')! - 0.3) < 1e-12);
  assert.equal(by('shaping.invalid_call'), -0.5);
  assert.equal(by('shaping.max_turns'), -0.5);
  assert.ok(Math.abs(shaped.score - (1 + 0.3 - 0.5 - 0.5)) < 1e-12);
});

function shippedConfigs(): string[] {
  const out: string[] = [];
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const p = join(dir, name);
      if (name === 'node_modules' || name.startsWith('.')) continue;
      if (statSync(p).isDirectory()) walk(p);
      else if (/^config.*\.ya?ml$/.test(name)) out.push(p);
    }
  };
  walk(join(ROOT, 'examples'));
  walk(join(ROOT, 'test'));
  return out;
}

test('config check passes on every shipped config', async () => {
  // The distributed fixtures name their brokers and services by environment variable.
  const env = { E2E_KAFKA: 'localhost:9092', CHAOS_KAFKA: 'localhost:9092', SCHEMA_REGISTRY_URL: 'http://localhost:8081', CLICKHOUSE_URL: 'http://localhost:8123' };
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, Object.fromEntries(Object.entries(env).filter(([k]) => process.env[k] === undefined)));
  try {
    const files = shippedConfigs();
    const cuda = (await import('../../native/index.ts')).cudaAvailable();
    assert.ok(files.some((f) => f.endsWith(join('examples', 'calculator', 'config.yaml'))));
    for (const f of files) {
      const { problems } = await checkConfig(f, {});
      // An example of an imported model (config.smollm2.yaml) reads what `rlstream import` writes under
      // .rlstream/models/, which no clone ships: in a clone that has not imported it, those paths are the only problems.
      const imported = (p: string) => /\.rlstream\/models\/\S+ does not exist/.test(p);
      // A GPU example (device: cuda) on a machine that cannot run CUDA: its device fields are named, as the run
      // would refuse them at start; on a GPU machine they pass.
      const machine = (p: string) => !cuda && /^(trainer|backend)\.device: 'cuda' cannot run in this process/.test(p);
      assert.deepEqual(problems.filter((p) => !imported(p) && !machine(p)), [], relative(ROOT, f));
    }
  } finally {
    for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k];
  }
});

test('rlstream config check lists every problem with its path and exits 1; print masks secrets', () => {
  const cli = (args: string[]) => spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'cli', 'main.ts'), ...args], { encoding: 'utf8', cwd: ROOT });
  const cfg = join(ROOT, 'examples', 'calculator', 'config.yaml');
  const bad = cli(['config', 'check', cfg, '--set', 'advantage.partial_groups=dorp', '--set', 'task.train=nightmare', '--set', 'trainer.learning_rate=-1']);
  assert.equal(bad.status, 1, bad.stderr);
  assert.match(bad.stderr, /3 problem\(s\)/);
  assert.match(bad.stderr, /advantage\.partial_groups: must be one of emit, drop \(got "dorp"\) \(did you mean drop\?\)/);
  assert.match(bad.stderr, /task\.train: must be one of easy, medium, hard/);
  assert.match(bad.stderr, /trainer\.learning_rate: must be > 0/);
  const missing = cli(['config', 'check', cfg, '--set', 'model.tokenizer=tokenizr', '--set', 'reward.module=./nowhere.ts']);
  assert.equal(missing.status, 1, missing.stderr);
  assert.match(missing.stderr, /model\.tokenizer: \S+tokenizr does not exist/);
  assert.match(missing.stderr, /reward\.module: \S+nowhere\.ts does not exist/);
  const printed = cli(['config', 'print', cfg, '--set', 'traces.kind=clickhouse', '--set', 'traces.url=http://h:1', '--set', 'traces.password=hunter2']);
  assert.equal(printed.status, 0, printed.stderr);
  assert.match(printed.stdout, /password: "\*+"/);
  assert.doesNotMatch(printed.stdout, /hunter2/);
  assert.match(printed.stdout, /staleness_bound: 2/);
  assert.match(printed.stdout, /partial_groups: emit/);
});

test('docs/configuration.md is what the schemas generate (npm run docs:config)', async () => {
  const { renderConfigDocs, DOC_PATH } = await import('../../cli/config/docs.ts');
  const { readFileSync } = await import('node:fs');
  assert.equal(readFileSync(DOC_PATH, 'utf8'), renderConfigDocs(), 'docs/configuration.md is stale: run npm run docs:config');
});

test('user code named by module/export: a missing module, a missing export and a wrong shape each say what to fix', async () => {
  const { Registry, functionShape } = await import('../../core/config/registry.ts');
  const { mkdtempSync, writeFileSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-usercode-'));
  try {
    writeFileSync(join(dir, 'reward.ts'), 'export function score(): number { return 1; }\nexport const weight = 5;\n');
    const r = new Registry<() => number>('reward function', functionShape('a function (data_source, solution, ground_truth) => number'));
    assert.equal(typeof (await r.load({ module: './reward.ts', export: 'score' }, dir, 'reward')), 'function');
    await assert.rejects(r.load({ module: './rewards.ts', export: 'score' }, dir, 'reward'), /^Error: reward\.module: \S+rewards\.ts does not exist|reward\.module: \S+rewards\.ts does not exist/);
    await assert.rejects(r.load({ module: './reward.ts', export: 'scor' }, dir, 'reward'), /reward\.export: \.\/reward\.ts has no export "scor" \(did you mean score\?\) \(exports: score, weight\)/);
    await assert.rejects(r.load({ module: './reward.ts', export: 'weight' }, dir, 'reward'), /reward\.export: \.\/reward\.ts export "weight" is not a function/);
    r.register('one', () => 1);
    assert.throws(() => r.get('onee', 'reward.name'), /reward\.name: unknown reward function "onee" \(did you mean one\?\) \(known: one\)/);
    // A run's copy takes its own plug-ins without adding them to the registry it was copied from.
    const run = r.copy().register('two', () => 2);
    assert.deepEqual([run.names(), r.names()], [['one', 'two'], ['one']]);
    assert.throws(() => run.register('two', 'not a function' as never), /reward function "two" is not a function/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the serve section: off by default, every key compiled; an out-of-range port is refused naming it', () => {
  const dflt = compileRunConfig({}, '/tmp').serve;
  assert.deepEqual(dflt, { enabled: false, host: '127.0.0.1', port: 0, model: null, maxSessions: 1024, idleTimeoutMs: 600_000, bodyLimitBytes: 4 * 1024 * 1024, requestReadTimeoutMs: 30_000, maxPromptTokens: null, maxSessionsPerToken: null, maxCallsPerToken: 256, dataSource: null });
  const set = compileRunConfig({ serve: { enabled: true, host: '0.0.0.0', port: 8100, model: 'policy', max_sessions: 8, idle_timeout_ms: 5000, body_limit_bytes: 65536, request_read_timeout_ms: 2000, max_prompt_tokens: 300, max_sessions_per_token: 2, max_calls_per_token: 3, data_source: 'mine' } }, '/tmp').serve;
  assert.deepEqual(set, { enabled: true, host: '0.0.0.0', port: 8100, model: 'policy', maxSessions: 8, idleTimeoutMs: 5000, bodyLimitBytes: 65536, requestReadTimeoutMs: 2000, maxPromptTokens: 300, maxSessionsPerToken: 2, maxCallsPerToken: 3, dataSource: 'mine' });
  assert.ok(issues({ serve: { max_calls_per_token: 0 } }).some((m) => m.startsWith('serve.max_calls_per_token: must be')));
  assert.ok(issues({ serve: { port: 70000 } }).some((m) => m.startsWith('serve.port: must be')), issues({ serve: { port: 70000 } }).join(' | '));
});

test('config print masks credentials wherever they appear: inside any URL, and under any secret-named key', async () => {
  const { maskSecrets, maskUrlCredentials } = await import('../../cli/config/run-config.ts');
  const cli = (args: string[]) => spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'cli', 'main.ts'), ...args], { encoding: 'utf8', cwd: ROOT });
  const cfg = join(ROOT, 'examples', 'calculator', 'config.yaml');
  const printed = cli(['config', 'print', cfg, '--set', 'traces.kind=clickhouse', '--set', 'traces.url=http://u:urlpass@ch:8123', '--set', 'registry.kind=http', '--set', 'registry.url=https://reguser:regpass@registry:8081']);
  assert.equal(printed.status, 0, printed.stderr);
  assert.doesNotMatch(printed.stdout, /urlpass|regpass/);
  assert.match(printed.stdout, /url: http:\/\/u:\*{8}@ch:8123/);
  assert.match(printed.stdout, /url: https:\/\/reguser:\*{8}@registry:8081/);
  // Generated cases: every scheme, a user alone (often a token), a password holding @ and :, several URLs in one string.
  for (const scheme of ['http', 'https', 'kafka', 'sasl_ssl', 'postgres+psycopg', 'ws']) {
    for (const [userinfo, shown] of [['u:p', 'u:********'], ['tok3n', '********'], ['u:p@ss:w', 'u:********'], ['a%40b:c%3Ad', 'a%40b:********']]) {
      assert.equal(maskUrlCredentials(`${scheme}://${userinfo}@host:1/p?q=x@y`), `${scheme}://${shown}@host:1/p?q=x@y`);
    }
  }
  assert.equal(maskUrlCredentials('a http://x:1@h and ftp://y:2@i, not http://h/a@b'), 'a http://x:********@h and ftp://y:********@i, not http://h/a@b');
  const masked = JSON.stringify(maskSecrets({ backend: { headers: { Authorization: 'Bearer abc' }, api_key: 'k', base_url: 'http://a:b@c' }, log: { sasl: { password: 1234 }, brokers: ['sasl_ssl://me:pw@k:9092'] }, rollout: { max_tokens: 5, stop_token_ids: [1] }, model: { tokenizer: 'tok' } }));
  assert.doesNotMatch(masked, /abc|"k"|:b@|1234|:pw@/);
  assert.match(masked, /"max_tokens":5,"stop_token_ids":\[1\]/);
  assert.match(masked, /"tokenizer":"tok"/);
});
