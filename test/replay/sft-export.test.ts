// The SFT export (`replay --into jsonl:`) round-trips: each exported conversation, rendered with the task's
// chat template and tools, gives back the trajectory's own token ids exactly, token for token. (The calculator's
// template writes nothing after an assistant's <|im_end|>; a template that does, ChatML's newline, has that text
// lead the next observation, masked: test/producers/tokenizer.test.ts checks that on Qwen3's template.)
// The worker runs the strict tokenization check, so a trajectory whose delta tokens differ from the full
// rendering in any token, whitespace included, is flagged and left out of the export. The trajectories are made by the real
// rollout worker and tool agent with the calculator task's tokenizer, template and calculator tool, into an
// embedded log; the model is a ScriptedBackend (a test double) that calls the calculator, once, twice in
// parallel, or not at all, then answers. A default replay also reads no internal topic (processor state), so
// it reports nothing undecodable.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { ReplayJob } from '../../consumers/replay/job.ts';
import { JsonlTarget } from '../../consumers/replay/targets.ts';
import type { DecodedEvent } from '../../core/serde/events.ts';
import { calculatorTools, problemRow } from '../../examples/calculator/index.ts';
import { MEDIUM, problems, take, type Problem } from '../../examples/calculator/task.ts';
import { ScriptedBackend, type ScriptTurn } from '../../producers/backends/scripted.ts';
import { ChatTokenizer, type ChatMessage, type ChatTool } from '../../producers/tokenizer/chat-tokenizer.ts';
import { RolloutWorker } from '../../producers/worker.ts';
import type { RewardedTrajectory, Trajectory } from '../../schemas/generated/types.ts';
import { REPO, rolloutOptionsFor } from '../producers/helpers.ts';

const tok = ChatTokenizer.load(join(REPO, 'examples', 'calculator', 'tokenizer'));
const PROBLEMS: Problem[] = take(problems(3, 'train', MEDIUM), 6);
const RUN = 'sft-export';
let dir: string;
let log: EventLog;
let registry: EmbeddedRegistry;
let serde: EventSerde;
const trajectories: Trajectory[] = [];

const call = (expr: string) => `<tool_call>\n{"name": "calculator", "arguments": {"expression": ${JSON.stringify(expr)}}}\n</tool_call>`;

/** Problem i: i % 3 == 0 answers at once, 1 makes one call, 2 makes two calls in one turn; then answers. */
function script({ promptText, turn }: ScriptTurn): string {
  const i = PROBLEMS.findIndex((p) => promptText().includes(p.question));
  assert.ok(i >= 0);
  const p = PROBLEMS[i]!;
  if (turn === 0 && i % 3 === 1) return call(p.expression);
  if (turn === 0 && i % 3 === 2) return `${call(p.expression)}\n${call(`${p.answer}*1`)}`;
  return `The answer is ${p.answer}.`;
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-sft-export-'));
  log = await openLog({ kind: 'embedded', dir, fsync: 'none' });
  registry = await EmbeddedRegistry.open(log);
  serde = await new EventSerde(registry).init();
  for (const t of [TOPICS.rolloutEvents, TOPICS.rewarded, TOPICS.policyVersions, TOPICS.control]) await log.createTopic({ name: t, partitions: 2 });
  const backend = new ScriptedBackend({ tokenizer: tok, script });
  const worker = new RolloutWorker({ runId: RUN, log, serde, backend, tokenizer: tok, tools: await calculatorTools(), followPolicy: false }, rolloutOptionsFor({ n: 2, staleness_bound: null, tokenization_check: 'strict', tokenization_check_every: 1 }));
  const completed: Trajectory[] = [];
  const consumer = await log.consumer({ groupId: 'collect', topics: [TOPICS.rolloutEvents], fromBeginning: true });
  await worker.run(PROBLEMS.map((p, i) => problemRow(p, i)));
  await worker.stop();
  for (let idle = 0; idle < 3; ) {
    const records = await consumer.poll({ maxRecords: 10_000, timeoutMs: 200 });
    idle = records.length === 0 ? idle + 1 : 0;
    for (const r of records) {
      const e = await serde.decode(r.value);
      if (e.name === 'TrajectoryCompleted') completed.push(e.value.trajectory);
    }
  }
  await consumer.close();
  assert.equal(completed.length, PROBLEMS.length * 2);
  trajectories.push(...completed);
  // Every trajectory is rewarded correct (the script always answers right); the reward's path is not under test.
  const producer = await log.producer({ idempotent: true });
  await producer.send(
    TOPICS.rewarded,
    completed.map((t) => {
      const r: RewardedTrajectory = { event_id: `r-${t.trajectory_id}`, time_ms: Date.now(), trajectory: t, reward: { score: 1, components: [], reward_fn: 'test', correct: true, token_rewards: null, exclude_from_loss: false } };
      return { key: t.group_id, value: serde.encode('RewardedTrajectory', r) };
    }),
  );
  await producer.close();
  // A stream processor's checkpoint topic (JSON, not an event): a default replay must leave it alone.
  await log.createTopic({ name: `_state.${RUN}.advantage`, partitions: 1 });
  const state = await log.producer({ idempotent: true });
  await state.send(`_state.${RUN}.advantage`, [{ key: 'checkpoint', value: Buffer.from('{"groups":{}}') }]);
  await state.close();
});

after(async () => {
  await registry?.close();
  await log?.close();
  rmSync(dir, { recursive: true, force: true });
});

test('SFT export: every successful trajectory, rendered with the template, gives back its own token ids; no tool call twice, no markup in tool messages', { timeout: 60_000 }, async () => {
  const file = join(dir, 'sft.jsonl');
  const target = new JsonlTarget(file);
  const end = await ReplayJob.start({ log, serde, target }).done;
  assert.equal(end.state, 'done', end.error ?? '');
  assert.equal(end.undecodable, 0, 'internal topics are not replayed');
  const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { messages: ChatMessage[]; tools: ChatTool[] });
  assert.deepEqual(target.skipped, { other_split: 0, parse_error: 0, tokenization_mismatch: 0, user_turn: 0, missing_tool_result: 0, missing_turn: 0 });
  assert.equal(lines.length, trajectories.length);
  const matched = new Set<Trajectory>();
  for (const { messages, tools } of lines) {
    assert.deepEqual(tools.map((t) => t.function.name), ['calculator']);
    for (const m of messages.filter((x) => x.role === 'tool')) {
      assert.doesNotMatch(m.content, /tool_response|assistant|user/, 'a tool message holds the result only');
      assert.ok(m.tool_call_id, 'a tool message names its call');
    }
    // The two samples of a group have the same tokens (the script answers alike): match each line to one of them.
    const rendered = tok.apply(messages, { tools });
    const t = trajectories.find((x) => !matched.has(x) && rendered.join(',') === [...x.prompt_ids, ...x.response_ids].join(','));
    assert.ok(t, `no trajectory has the tokens of ${JSON.stringify(messages).slice(0, 300)}`);
    // Each call rendered once: as many <tool_call> blocks in the rendering as the trajectory made calls.
    assert.equal(tok.render(messages, { tools }).split('<tool_call>\n{"name": "calculator"').length - 1, t.num_tool_calls);
    matched.add(t);
  }
  assert.equal(matched.size, trajectories.length);
  assert.ok(trajectories.some((t) => t.num_tool_calls === 2) && trajectories.some((t) => t.num_tool_calls === 0));
});

test('SFT export of a log where a trajectory was cut short and rerun under the same id (logs before reruns got new ids): the rerun, read later, is exported', { timeout: 60_000 }, async () => {
  const t = trajectories.find((x) => x.num_tool_calls === 1)!;
  const events: { event: DecodedEvent | null }[] = [];
  const consumer = await log.consumer({ groupId: `rerun-${Date.now()}`, topics: [TOPICS.rolloutEvents, TOPICS.rewarded], fromBeginning: true });
  for (let idle = 0; idle < 3; ) {
    const records = await consumer.poll({ maxRecords: 10_000, timeoutMs: 200 });
    idle = records.length === 0 ? idle + 1 : 0;
    for (const r of records) {
      const e = await serde.decode(r.value);
      const id = 'trajectory_id' in e.value ? e.value.trajectory_id : 'trajectory' in e.value ? e.value.trajectory.trajectory_id : null;
      if (id === t.trajectory_id) events.push({ event: e });
    }
  }
  await consumer.close();
  const turn0 = events.find((e) => e.event?.name === 'TurnCompleted' && e.event.value.turn_index === 0)!.event as DecodedEvent & { name: 'TurnCompleted' };
  // The first attempt's turn 0, published before the crash: another answer under the same (trajectory, turn_index).
  const cut: DecodedEvent = { ...turn0, value: { ...turn0.value, text: 'The answer is 0.', token_ids: tok.encode('The answer is 0.'), tool_calls: [] } };
  const started = events.findIndex((e) => e.event?.name === 'TrajectoryStarted');
  events.splice(started + 1, 0, { event: cut });
  const file = join(dir, 'rerun.jsonl');
  const target = new JsonlTarget(file);
  await target.accept(events);
  await target.finish();
  const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { messages: ChatMessage[]; tools: ChatTool[] });
  assert.equal(lines.length, 1);
  assert.deepEqual(tok.apply(lines[0]!.messages, { tools: lines[0]!.tools }), [...t.prompt_ids, ...t.response_ids], 'the rerun exported, token for token');
});
