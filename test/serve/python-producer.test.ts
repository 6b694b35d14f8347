// A producer written in Python from docs/events.md alone (test/serve/producer.py: confluent-kafka with its
// AvroSerializer against the schema registry) publishes complete tool-calling trajectories to a private Kafka
// broker; the reward and advantage consumers and the trainer of a run on that broker take them: every record sits
// on the partition Kafka's Java client would choose, every trajectory is rewarded by its task, gets an advantage,
// and is trained on. Skips without python3, the Kafka jars or the registry (fails under RLSTREAM_REQUIRE_SERVICES=1).
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { newId } from '../../core/ids.ts';
import { partitionForKey } from '../../core/log/partitioner.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { openRunContext, type RunContext } from '../../cli/run/context.ts';
import { createAdvantage, createReward, createTrainer } from '../../cli/run/roles.ts';
import { CALCULATOR_TOOL, answerText, promptMessages } from '../../examples/calculator/conversation.ts';
import { MEDIUM, problems, take } from '../../examples/calculator/task.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from '../../producers/tokenizer/delta.ts';
import type { AdvantagedTrajectory, RewardedTrajectory, TrainStep } from '../../schemas/generated/types.ts';
import { PrivateBroker } from '../../testkit/kafka-broker.ts';

const ROOT = join(import.meta.dirname, '../..');
// Where infra/setup.sh installs it: RLSTREAM_INFRA_DIR (infra/env.sh), by default the checkout's .infra/.
const VENV_PYTHON = join(process.env['RLSTREAM_INFRA_DIR'] ?? join(ROOT, '.infra'), 'python/bin/python');
const python = existsSync(VENV_PYTHON) ? VENV_PYTHON : spawnSync('python3', ['--version']).status === 0 ? 'python3' : null;
const registryUrl = process.env['SCHEMA_REGISTRY_URL'];
const missing = python === null ? 'no python3 on this machine' : !registryUrl || !PrivateBroker.libs() ? 'needs the schema registry (SCHEMA_REGISTRY_URL) and the Kafka jars (bash infra/setup.sh)' : null;
if (missing && python !== null && process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') throw new Error(`Python producer test: ${missing}`);

async function read(ctx: RunContext, topic: string): Promise<{ partition: number; key: Buffer | null; value: unknown }[]> {
  const c = await ctx.log.consumer({ groupId: `read-${newId()}`, topics: [topic], fromBeginning: true });
  const out: { partition: number; key: Buffer | null; value: unknown }[] = [];
  try {
    for (let empty = 0; empty < 3; ) {
      const recs = await c.poll({ timeoutMs: 500, maxRecords: 1000 });
      if (recs.length === 0) empty++;
      for (const r of recs) out.push({ partition: r.partition, key: r.key ?? null, value: (await ctx.serde.decode(r.value)).value });
    }
  } finally {
    await c.close();
  }
  return out;
}

test('a Python producer (confluent-kafka, AvroSerializer) feeds the reward and advantage consumers and the trainer', { skip: missing ?? false, timeout: 480_000 }, async () => {
  const check = spawnSync(python!, ['-c', 'import confluent_kafka.schema_registry.avro, fastavro']);
  assert.equal(check.status, 0, `confluent-kafka with Avro support is missing for ${python}: run infra/setup.sh (it installs it into .infra/python)\n${check.stderr}`);

  const dir = mkdtempSync(join(tmpdir(), 'rlstream-pyproducer-'));
  const broker = await PrivateBroker.start(join(dir, 'kafka'));
  process.env['E2E_KAFKA'] = broker.brokers;
  const runId = `py-${newId().slice(0, 8)}`;
  const config = loadRunConfig(join(ROOT, 'test/e2e/fixtures/config.yaml'), { 'run.id': runId, 'run.data_dir': join(dir, 'data'), 'trainer.max_steps': 1, 'trainer.groups_per_step': 2 });
  const ctx = await openRunContext(config, silentLogger);
  try {
    const processors = [await createReward(ctx), createAdvantage(ctx)];
    const runs = processors.map((p) => p.run());
    const trainer = createTrainer(ctx, runId, config.run.dataDir);
    await trainer.start();
    const training = trainer.run();

    // Two groups of two: one sample answers right, the other wrong, after a calculator call and its result.
    const tokenizer = ChatTokenizer.load(join(ROOT, 'examples/calculator/tokenizer'));
    const delta = new DeltaTokenizer(tokenizer);
    const eos = tokenizer.eosTokenId!;
    const groups = take(problems(21, 'train', MEDIUM), 2).map((p) =>
      [p.answer, p.answer + 1].map((answer) => {
        const prompt = promptMessages(p);
        const call = `<tool_call>\n{"name": "calculator", "arguments": {"expression": "${p.expression}"}}\n</tool_call>`;
        const result = { role: 'tool', content: String(p.answer), tool_call_id: 'call_0_0', name: 'calculator' };
        return {
          data_source: 'rlstream/calculator',
          ground_truth: String(p.answer),
          prompt_messages: prompt,
          prompt_ids: tokenizer.apply(prompt, { tools: [CALCULATOR_TOOL], addGenerationPrompt: true }),
          turns: [
            { role: 'assistant', ids: [...tokenizer.encode(call), eos], text: call, tool_calls: [{ id: 'call_0_0', name: 'calculator', arguments_json: JSON.stringify({ expression: p.expression }) }] },
            { role: 'tool', ids: delta.deltaIds([result]).ids, text: String(p.answer), result: String(p.answer) },
            { role: 'assistant', ids: [...tokenizer.encode(answerText(answer)), eos], text: answerText(answer) },
          ],
        };
      }),
    );
    const producer = await new Promise<{ code: number | null; out: string; err: string }>((resolve) => {
      const child = spawn(python!, [join(import.meta.dirname, 'producer.py')], {
        env: { ...process.env, KAFKA_BROKERS: broker.brokers, SCHEMA_REGISTRY_URL: registryUrl!, RLSTREAM_RUN_ID: runId, RLSTREAM_EPISODES: JSON.stringify(groups) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      child.on('close', (code) => resolve({ code, out, err }));
    });
    assert.equal(producer.code, 0, `producer.py failed:\n${producer.err}`);
    // Per trajectory: started, three turns, one tool call, completed.
    assert.deepEqual(JSON.parse(producer.out), { sent: 4 * 6 });

    await training;
    for (const p of processors) await p.stop();
    await Promise.all(runs);
    await trainer.close();

    const events = await read(ctx, TOPICS.rolloutEvents);
    assert.equal(events.length, 24);
    for (const e of events) assert.equal(e.partition, partitionForKey(e.key!, 4), 'a record is not on the partition murmur2 gives its key');
    const rewarded = (await read(ctx, TOPICS.rewarded)).map((r) => r.value as RewardedTrajectory);
    assert.equal(rewarded.length, 4);
    assert.ok(rewarded.every((r) => r.reward.reward_fn === 'rlstream/calculator'));
    assert.deepEqual(rewarded.map((r) => r.reward.correct).sort(), [false, false, true, true]);
    const advantaged = (await read(ctx, TOPICS.advantaged)).map((r) => r.value as AdvantagedTrajectory);
    assert.equal(advantaged.length, 4);
    assert.ok(advantaged.every((a) => a.group.group_members === 2 && !a.group.partial && a.advantages.some((x) => x !== 0)));
    const steps = (await read(ctx, TOPICS.trainSteps)).map((r) => r.value as TrainStep).filter((s) => s.run_id === runId);
    assert.equal(steps.length, 1);
    assert.deepEqual([...steps[0]!.trajectory_ids].sort(), advantaged.map((a) => a.trajectory.trajectory_id).sort());
    const dead = await read(ctx, TOPICS.deadLetter);
    assert.equal(dead.length, 0);
  } finally {
    await ctx.close();
    await broker.halt();
    rmSync(dir, { recursive: true, force: true });
  }
});
