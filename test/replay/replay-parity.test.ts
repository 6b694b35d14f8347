// A replay of a finished run gives the run's own rewards and advantages, bit for bit. The run: `rlstream serve`'s
// job on the calculator config with reward shaping (tool bonus, turn-limit and overlong penalties) and dynamic
// sampling on, groups of 4 recorded over real HTTP (the model is the scripted backend, a TEST DOUBLE answering a
// fixed script: tool calls, right and wrong answers), some completed with an outside agent's reward and some
// scored by the task's function; then the run's own reward and advantage consumers (built by cli/run/roles.ts)
// over its log. The replay is the real `rlstream replay --reward run --config` process into a new topic of the
// same log; every reward (score and components) and every advantage and return must equal the live ones
// exactly, and the groups dynamic sampling filtered must be filtered again.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { parse, stringify } from 'yaml';
import { resolvePlugins, runAdvantageStage, runRewardStage } from '../../cli/run/plugins.ts';
import { createAdvantage, createReward } from '../../cli/run/roles.ts';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { ReplayJob } from '../../consumers/replay/job.ts';
import { TopicTarget } from '../../consumers/replay/targets.ts';
import type { ServeJob } from '../../cli/run/serve-job.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { ScriptedBackend } from '../../producers/backends/scripted.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { AdvantagedTrajectory, RewardedTrajectory } from '../../schemas/generated/types.ts';
import { call, CONFIG, startServe } from '../serve/helpers.ts';

const REPO = join(import.meta.dirname, '..', '..');
const BIN = join(REPO, 'bin', 'rlstream.js');
const TOKENIZER = ChatTokenizer.load(join(REPO, 'examples', 'calculator', 'tokenizer'));
const CALCULATOR = { type: 'function', function: { name: 'calculator', description: 'Exact arithmetic.', parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } } };

let dir: string;
let configPath: string;
let job: ServeJob;

/** The calculator config, its paths made absolute, with shaping and dynamic sampling on, written beside the run. */
function writeConfig(dataDir: string): string {
  const raw = parse(readFileSync(CONFIG, 'utf8')) as Record<string, Record<string, unknown>>;
  const base = join(REPO, 'examples', 'calculator');
  raw['model'] = { config: join(base, 'model.json'), tokenizer: join(base, 'tokenizer'), init: join(base, 'checkpoints', 'sft') };
  raw['run'] = { ...raw['run'], data_dir: dataDir };
  raw['traces'] = { kind: 'none' };
  raw['rollout'] = { ...raw['rollout'], n: 4, response_length: 96 };
  raw['reward'] = { shaping: { tool_success_bonus: 0.125, invalid_call_penalty: 0.25, max_turns_penalty: 0.375, overlong_buffer_len: 40, overlong_penalty_factor: 0.5 } };
  raw['advantage'] = { estimator: 'grpo', dynamic_sampling: true, grpo: { epsilon: 1e-6 } };
  const path = join(dataDir, 'config.yaml');
  writeFileSync(path, stringify(raw));
  return path;
}

/** Sample k of a group of 4, by the order the backend is asked: k 0 calls the tool, 1 answers right, 2 wrong, 3 rambles past the overlong buffer. */
let asked = 0;
function script({ promptText, turn }: { promptText(): string; turn: number }): string {
  const m = /What is (\d+) \+ (\d+)\?/.exec(promptText());
  assert.ok(m, 'the prompt names its sum');
  const right = Number(m[1]) + Number(m[2]);
  if (turn > 0) return `The answer is ${right}.`;
  const k = asked++ % 4;
  if (m[1] === m[2]) return `The answer is ${right}.`; // a sum of equal terms: every sample alike
  if (k === 0) return `<tool_call>\n{"name": "calculator", "arguments": {"expression": "${m[1]}+${m[2]}"}}\n</tool_call>`;
  if (k === 1) return `The answer is ${right}.`;
  if (k === 2) return `The answer is ${right + 1}.`;
  return `Let me think about it. ${'Adding the two numbers step by step, carefully. '.repeat(1)}The answer is ${right}.`;
}

/** One group of 4 on the sum a + b: each sample answered (a tool call gets its result), then completed with `rewards[k]` (undefined: the task's function scores it) and `terminations[k]`. */
async function group(a: number, b: number, rewards: (number | undefined)[], terminations: (string | undefined)[] = []): Promise<void> {
  const prompt = [{ role: 'user', content: `What is ${a} + ${b}?` }];
  const first = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: prompt, tools: [CALCULATOR], n: 4, metadata: { ground_truth: String(a + b), data_source: 'rlstream/calculator' } });
  assert.equal(first.status, 200, first.text);
  const choices = first.json['choices'] as { message: { content: string | null; tool_calls?: { id: string }[] }; rlstream: { trajectory_id: string } }[];
  for (const [k, c] of choices.entries()) {
    const id = c.rlstream.trajectory_id;
    if (c.message.tool_calls?.length) {
      const next = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: [...prompt, c.message, { role: 'tool', tool_call_id: c.message.tool_calls[0]!.id, content: String(a + b) }], tools: [CALCULATOR] }, { 'x-rlstream-trajectory': id });
      assert.equal(next.status, 200, next.text);
    }
    const body = { ...(rewards[k] !== undefined ? { reward: rewards[k] } : {}), ...(terminations[k] ? { termination: terminations[k] } : {}) };
    const done = await call(job, 'POST', `/v1/trajectories/${id}/complete`, body);
    assert.equal(done.status, 200, done.text);
  }
}

/** A value as text with every number written as its float64 bits: equal texts are equal bit for bit. */
function bits(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) => (typeof x === 'number' ? Buffer.from(new Float64Array([x]).buffer).toString('hex') : x));
}

async function events<T>(log: EventLog, serde: EventSerde, topic: string, name: string): Promise<T[]> {
  const c = await log.consumer({ groupId: `read-${Math.random()}`, topics: [topic], fromBeginning: true });
  const out: T[] = [];
  try {
    for (;;) {
      const recs = await c.poll({ timeoutMs: 300, maxRecords: 10_000 });
      if (recs.length === 0) break;
      for (const r of recs) {
        const e = await serde.decode(r.value);
        if (e.name === name) out.push(e.value as T);
      }
    }
  } finally {
    await c.close();
  }
  return out;
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-replay-parity-'));
  configPath = writeConfig(dir);
  ({ job } = await startServe({ configPath, overrides: { 'run.data_dir': dir }, wrapBackend: () => new ScriptedBackend({ tokenizer: TOKENIZER, script }) }));
});

after(async () => {
  await job.close().catch(() => undefined);
  rmSync(dir, { recursive: true, force: true });
});

test('replay --reward run --config gives the live run its own rewards and advantages bit for bit (shaping, outside rewards, dynamic sampling)', { timeout: 300_000 }, async () => {
  await group(12, 30, [undefined, undefined, undefined, undefined]);
  await group(7, 8, [undefined, undefined, undefined, undefined], ['max_turns', undefined, 'max_turns', undefined]);
  await group(40, 2, [1, 0.5, 0, -0.3]);
  await group(3, 4, [0.7, 0.7, 0.7, 0.7]); // outside rewards alike, but shaping differs (the tool call's bonus)
  await group(9, 9, [1, 1, 1, 1], [undefined, undefined, undefined, undefined]);
  await group(5, 6, [0.1, undefined, 0.3, undefined]);

  // The live run: the run's own reward and advantage consumers over its log, until both have caught up.
  const reward = await createReward(job.ctx);
  const advantage = createAdvantage(job.ctx);
  const running = [reward.run(), advantage.run()];
  const deadline = Date.now() + 120_000;
  while ((await reward.lag()) + (await advantage.lag()) > 0 || advantage.metrics().counters['groups_emitted'] === undefined) {
    assert.ok(Date.now() < deadline, 'the live consumers catch up');
    await new Promise((r) => setTimeout(r, 200));
  }
  await reward.stop();
  await advantage.stop();
  await Promise.all(running);
  const live = {
    rewarded: await events<RewardedTrajectory>(job.ctx.log, job.ctx.serde, TOPICS.rewarded, 'RewardedTrajectory'),
    advantaged: await events<AdvantagedTrajectory>(job.ctx.log, job.ctx.serde, TOPICS.advantaged, 'AdvantagedTrajectory'),
  };
  await job.close();

  // The run exercised what a replay used to miss: shaping terms, outside rewards, a filtered group.
  const components = new Set(live.rewarded.flatMap((r) => r.reward.components.map((c) => c.name)));
  for (const c of ['shaping.tool_success', 'shaping.max_turns', 'shaping.overlong', 'outcome']) assert.ok(components.has(c), `the run has a ${c} component (${[...components].join(', ')})`);
  assert.ok(live.rewarded.some((r) => r.reward.reward_fn === 'external') && live.rewarded.some((r) => r.reward.reward_fn === 'rlstream/calculator'));
  assert.equal(live.rewarded.length, 24);
  assert.equal(live.advantaged.length, 20, 'the group of equal rewards is filtered by dynamic sampling');

  const r = spawnSync(process.execPath, [BIN, 'replay', '--log', join(dir, 'log'), '--into', 'topic:replayed', '--reward', 'run', '--config', configPath], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(r.status, 0, r.stderr);
  const summary = JSON.parse(r.stdout.trim().split('\n').pop()!) as { state: string; written: number; refused: number; filtered_groups: number };
  assert.deepEqual([summary.state, summary.written, summary.refused, summary.filtered_groups], ['done', 20, 0, 1]);

  const log = await openLog({ kind: 'embedded', dir: join(dir, 'log') });
  const registry = await EmbeddedRegistry.open(log);
  try {
    const serde = await new EventSerde(registry).init();
    const replayed = new Map((await events<AdvantagedTrajectory>(log, serde, 'replayed', 'AdvantagedTrajectory')).map((a) => [a.trajectory.trajectory_id, a]));
    assert.equal(replayed.size, live.advantaged.length);
    const liveRewards = new Map(live.rewarded.map((x) => [x.trajectory.trajectory_id, x.reward]));
    for (const a of live.advantaged) {
      const b = replayed.get(a.trajectory.trajectory_id);
      assert.ok(b, `${a.trajectory.trajectory_id} replayed`);
      assert.equal(bits(b.reward), bits(liveRewards.get(a.trajectory.trajectory_id)));
      assert.equal(bits(b.reward), bits(a.reward));
      assert.equal(bits(b.advantages), bits(a.advantages));
      assert.equal(bits(b.returns), bits(a.returns));
      assert.equal(bits(b.group), bits(a.group));
      assert.equal(b.estimator, a.estimator);
    }
    // The comparison can fail: the same replay without the run's shaping (as replay did before) differs.
    const config = loadRunConfig(configPath);
    const stage = runRewardStage(config, await resolvePlugins(config));
    const bare = await TopicTarget.open(log, 'bare', serde, { label: 'bare', reward: { ...stage, shaping: {} }, advantage: runAdvantageStage(config.advantage) });
    assert.equal((await ReplayJob.start({ log, serde, target: bare, topics: [TOPICS.rolloutEvents] }).done).state, 'done');
    const unshaped = await events<AdvantagedTrajectory>(log, serde, 'bare', 'AdvantagedTrajectory');
    assert.ok(unshaped.some((u) => bits(u.reward) !== bits(replayed.get(u.trajectory.trajectory_id)?.reward)), 'without shaping the rewards differ');
  } finally {
    await registry.close();
    await log.close();
  }
});
