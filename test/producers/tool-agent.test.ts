// The tool agent end to end on GSM8K prompts with the real Qwen3 tokenizer and chat template: rows →
// worker → embedded log (and Kafka when KAFKA_BROKERS is set), read back and checked event by event:
// order, keys, loss masks (assistant 1, tool 0), token/text consistency, tool calls and parse errors.
// The model is a ScriptedBackend (a test double) that answers with the GSM8K calculator annotations.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { TOPICS } from '../../core/topics.ts';
import type { Trajectory, TurnCompleted } from '../../schemas/generated/types.ts';
import { Gsm8kInteraction, interactions as registeredInteractions } from '../../producers/agent/interaction.ts';
import { ScriptedBackend, type ScriptTurn } from '../../producers/backends/scripted.ts';
import { gsm8kRow } from '../../producers/dataset/gsm8k.ts';
import { verlGsm8kSolution } from '../../producers/dataset/verl-gsm8k.ts';
import { CalculatorTool } from '../../producers/tools/calculator.ts';
import { ToolSet } from '../../producers/tools/tool-set.ts';
import { RolloutWorker } from '../../producers/worker.ts';
import { annotations, embeddedLog, gsm8kRecords, openTestLog, qwen3, readTopic, rolloutOptionsFor, type ReadEvent, type RolloutSectionForTest, type TestLog } from './helpers.ts';

const records = gsm8kRecords('train', 5);
const MALFORMED_ROW = 2;

function call(expr: string): string {
  return `<tool_call>\n{"name": "calculator", "arguments": {"expression": ${JSON.stringify(expr)}}}\n</tool_call>`;
}

/** The "model": computes each annotation with the calculator, then answers with the ground truth. */
function gsm8kScript({ promptText, turn }: ScriptTurn): string {
  const text = promptText();
  const idx = records.findIndex((r) => text.includes(r.question));
  assert.ok(idx >= 0, 'the prompt carries a known question');
  const rec = records[idx]!;
  const toolTurns = idx === MALFORMED_ROW ? 2 : 1;
  if (idx === MALFORMED_ROW && turn === 0) return '<think>\nLet me add.\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+"\n</tool_call>';
  if (turn < toolTurns) return `<think>\nI will compute each step.\n</think>\n\n${annotations(rec.answer).map((a) => call(a.expr)).join('\n')}`;
  const gt = verlGsm8kSolution(rec.answer);
  return `The total is ${gt}.\n#### ${gt}`;
}

async function runGsm8k(t: TestLog, options: RolloutSectionForTest, runId: string) {
  const tok = qwen3();
  const backend = new ScriptedBackend({ tokenizer: tok, script: gsm8kScript });
  const tools = new ToolSet().add(new CalculatorTool());
  const worker = new RolloutWorker({ runId, log: t.log, serde: t.serde, backend, tokenizer: tok, tools, followPolicy: false }, rolloutOptionsFor({ n: 2, staleness_bound: null, ...options }));
  await worker.run(records.map((r, i) => gsm8kRow(r, i, 'train')));
  const snap = worker.snapshot();
  await worker.stop();
  return { backend, snap };
}

function byTrajectory(events: ReadEvent[]): Map<string, ReadEvent[]> {
  const m = new Map<string, ReadEvent[]>();
  for (const e of events) {
    const v = e.event.value as { trajectory_id?: string; trajectory?: Trajectory };
    const id = v.trajectory_id ?? v.trajectory!.trajectory_id;
    m.set(id, [...(m.get(id) ?? []), e]);
  }
  return m;
}

async function checkGsm8kRun(t: TestLog, runId: string): Promise<void> {
  const tok = qwen3();
  const { backend, snap } = await runGsm8k(t, { tokenization_check: 'ignore_strippable', tokenization_check_every: 1 }, runId);
  assert.equal(snap.trajectoriesCompleted, records.length * 2);
  assert.equal(snap.eventsFailed, 0);
  const ofRun = (e: ReadEvent) => (e.event.value as { run_id?: string; trajectory?: { run_id: string } }).run_id === runId || (e.event.value as { trajectory?: { run_id: string } }).trajectory?.run_id === runId;
  const all = await readTopic(t, TOPICS.rolloutEvents, snap.eventsPublished, 20_000, ofRun);
  assert.equal(all.length, snap.eventsPublished);

  const groups = new Map<string, Set<number>>();
  const trajs = byTrajectory(all);
  assert.equal(trajs.size, records.length * 2);
  for (const [trajectoryId, evs] of trajs) {
    // Order within a trajectory: started, then turns and tool calls, then completed.
    assert.equal(evs[0]!.event.name, 'TrajectoryStarted');
    assert.equal(evs[evs.length - 1]!.event.name, 'TrajectoryCompleted');
    const traj = (evs[evs.length - 1]!.event.value as { trajectory: Trajectory }).trajectory;
    assert.equal(traj.trajectory_id, trajectoryId);
    // Keys: every event of the trajectory keyed by its group, all in one partition.
    for (const e of evs) assert.equal(e.record.key?.toString(), traj.group_id);
    assert.equal(new Set(evs.map((e) => e.record.partition)).size, 1);
    const parts = groups.get(traj.group_id) ?? new Set<number>();
    parts.add(evs[0]!.record.partition);
    groups.set(traj.group_id, parts);

    const started = evs[0]!.event.value as { prompt_token_ids: number[]; prompt_messages: { content: string }[]; tools: { name: string }[] };
    assert.deepEqual(started.tools.map((x) => x.name), ['calculator']);
    assert.deepEqual(traj.prompt_ids, started.prompt_token_ids);
    const rowIdx = records.findIndex((r) => started.prompt_messages[1]!.content.startsWith(r.question));
    assert.ok(rowIdx >= 0);

    const turns = evs.filter((e) => e.event.name === 'TurnCompleted').map((e) => e.event.value as TurnCompleted);
    const calls = evs.filter((e) => e.event.name === 'ToolCallCompleted');
    assert.deepEqual(turns.map((x) => x.turn_index), turns.map((_, i) => i), 'turn indexes are dense and in order');
    // A tool call is published after the assistant turn that made it and before the tool turn answering it.
    for (const c of calls) {
      const v = c.event.value as { turn_index: number };
      const pos = evs.indexOf(c);
      const asst = evs.findIndex((e) => e.event.name === 'TurnCompleted' && (e.event.value as TurnCompleted).turn_index === v.turn_index);
      const toolTurn = evs.findIndex((e) => e.event.name === 'TurnCompleted' && (e.event.value as TurnCompleted).turn_index === v.turn_index + 1);
      assert.ok(asst < pos && pos < toolTurn, 'tool call between its assistant turn and the tool turn');
      assert.equal((c.event.value as { status: string }).status, 'ok');
    }

    // Roles alternate assistant/tool and end with the answer.
    const expectedRoles = rowIdx === MALFORMED_ROW ? ['assistant', 'tool', 'assistant', 'tool', 'assistant'] : ['assistant', 'tool', 'assistant'];
    assert.deepEqual(turns.map((x) => x.role), expectedRoles);
    assert.deepEqual(traj.turn_roles, expectedRoles);
    assert.equal(traj.termination, 'stop');
    assert.equal(traj.num_tool_calls, annotations(records[rowIdx]!.answer).length * (rowIdx === MALFORMED_ROW ? 1 : 1));

    // Masks and tokens: the trajectory is the concatenation of its turns.
    let offset = 0;
    for (const turn of turns) {
      assert.equal(traj.turn_offsets[turn.turn_index], offset);
      const want = turn.role === 'assistant' ? 1 : 0;
      assert.ok(turn.response_mask.every((m) => m === want), `${turn.role} turn mask is ${want}`);
      assert.deepEqual(traj.response_ids.slice(offset, offset + turn.token_ids.length), turn.token_ids);
      assert.deepEqual(traj.response_mask.slice(offset, offset + turn.token_ids.length), turn.response_mask);
      if (turn.role === 'assistant') {
        assert.equal(turn.logprobs.length, turn.token_ids.length);
        assert.equal(turn.token_ids[turn.token_ids.length - 1], tok.eosTokenId, 'assistant turns end with the end-of-turn token');
        assert.equal(turn.policy_version, 0);
      } else {
        assert.equal(turn.logprobs.length, 0);
        assert.equal(turn.tokenization_mismatch, false, 'delta tokenization agrees with the full template (ignoring whitespace)');
        assert.ok(turn.text.includes('<tool_response>'));
      }
      offset += turn.token_ids.length;
    }
    assert.equal(offset, traj.response_ids.length);
    assert.equal(traj.response_logprobs.length, traj.response_ids.length);
    traj.response_mask.forEach((m, i) => {
      assert.equal(traj.response_logprobs[i], m === 1 ? -0.25 : 0);
      assert.equal(traj.response_policy_versions[i], m === 1 ? 0 : -1);
    });
    assert.equal(tok.decode(traj.response_ids, { skipSpecialTokens: true }), traj.response_text);
    assert.equal(turns.map((x) => x.text).join(''), traj.response_text);
    assert.ok(traj.response_text.endsWith(`#### ${verlGsm8kSolution(records[rowIdx]!.answer)}`));

    // The first tool turn carries the calculator's result of the first annotation.
    const firstAnn = annotations(records[rowIdx]!.answer)[0]!;
    const toolTurn = turns.find((x, i) => x.role === 'tool' && (rowIdx !== MALFORMED_ROW || i > 1))!;
    assert.ok(toolTurn.text.includes(`<tool_response>\n${Number(firstAnn.result)}\n</tool_response>`), `tool turn shows ${firstAnn.result}: ${toolTurn.text}`);

    if (rowIdx === MALFORMED_ROW) {
      assert.match(turns[0]!.tool_call_parse_error ?? '', /failed to decode tool call/);
      assert.deepEqual(turns[0]!.tool_calls, []);
      assert.match(turns[1]!.text, /Error: failed to decode tool call/);
      assert.equal(traj.num_invalid_tool_calls, 1);
    } else {
      assert.equal(turns[0]!.tool_call_parse_error, null);
      assert.equal(turns[0]!.tool_calls.length, annotations(records[rowIdx]!.answer).length);
    }
  }
  // Groups of n=2 share a group id (and so a partition).
  assert.equal(groups.size, records.length);
  for (const parts of groups.values()) assert.equal(parts.size, 1);

  // The backend saw the whole context: prompt + every earlier turn, and sticky session ids.
  const second = backend.requests.find((r) => r.promptIds.length > 0 && backend.requests.filter((x) => x.sessionId === r.sessionId).indexOf(r) === 1)!;
  const completed = [...trajs.values()].map((evs) => (evs[evs.length - 1]!.event.value as { trajectory: Trajectory }).trajectory).find((x) => x.trajectory_id === second.sessionId)!;
  const firstTurns = completed.turn_offsets[2]!;
  assert.deepEqual(second.promptIds, [...completed.prompt_ids, ...completed.response_ids.slice(0, firstTurns)]);
}

describe('tool agent on GSM8K with Qwen3', () => {
  test('events into the embedded log: order, keys, masks, tokens and text', async () => {
    const t = await embeddedLog();
    try {
      await checkGsm8kRun(t, 'run-gsm8k');
    } finally {
      await t.cleanup();
    }
  });

  test('Kafka variant (KAFKA_BROKERS)', async (ctx) => {
    const brokers = process.env['KAFKA_BROKERS'];
    if (!brokers) {
      if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') assert.fail('KAFKA_BROKERS is not set but RLSTREAM_REQUIRE_SERVICES=1');
      ctx.skip('KAFKA_BROKERS not set');
      return;
    }
    const t = await openTestLog({ kind: 'kafka', brokers: brokers.split(',') }, 4);
    try {
      await checkGsm8kRun(t, `run-gsm8k-kafka-${Date.now()}`);
    } finally {
      await t.cleanup();
    }
  });

  test('strict tokenization check agrees: the newline Qwen3 writes after <|im_end|> leads each tool turn', async () => {
    const t = await embeddedLog();
    try {
      const { snap } = await runGsm8k(t, { tokenization_check: 'strict', tokenization_check_every: 1 }, 'run-strict');
      assert.equal(snap.counters['tokenization_mismatches'] ?? 0, 0);
      const evs = await readTopic(t, TOPICS.rolloutEvents, snap.eventsPublished);
      const tok = qwen3();
      const toolTurns = evs.filter((e) => e.event.name === 'TurnCompleted' && (e.event.value as TurnCompleted).role === 'tool').map((e) => e.event.value as TurnCompleted);
      assert.ok(toolTurns.length >= records.length * 2);
      for (const turn of toolTurns) {
        assert.equal(turn.tokenization_mismatch, false);
        assert.ok(tok.decode(turn.token_ids).startsWith('\n<|im_start|>user\n<tool_response>'), tok.decode(turn.token_ids));
      }
    } finally {
      await t.cleanup();
    }
  });

  test('interaction: the user simulator says "try again" until the answer is right', async () => {
    const t = await embeddedLog();
    try {
      const tok = qwen3();
      const rec = records[0]!;
      const gt = verlGsm8kSolution(rec.answer);
      const backend = new ScriptedBackend({ tokenizer: tok, script: ({ turn }) => (turn === 0 ? 'I think it is 7.\n#### 7' : `Let me recheck: ${gt}.\n#### ${gt}`) });
      const interactions = registeredInteractions.copy();
      const worker = new RolloutWorker(
        { runId: 'run-interaction', log: t.log, serde: t.serde, backend, tokenizer: tok, tools: new ToolSet().add(new CalculatorTool()), interactions, followPolicy: false },
        rolloutOptionsFor({ staleness_bound: null }),
      );
      const [traj] = await worker.evaluate([gsm8kRow(rec, 0, 'test')], { split: 'test' });
      await worker.stop();
      assert.ok(traj);
      assert.deepEqual(traj.turn_roles, ['assistant', 'user', 'assistant']);
      assert.deepEqual(traj.interaction_rewards, [0, 1]);
      assert.equal(traj.termination, 'stop');
      const userStart = traj.turn_offsets[1]!;
      const userEnd = traj.turn_offsets[2]!;
      assert.ok(traj.response_mask.slice(userStart, userEnd).every((m) => m === 0));
      assert.match(tok.decode(traj.response_ids.slice(userStart, userEnd)), /^\n<\|im_start\|>user\nYour response is incorrect! You need to reflect on your answer and try again\./);
    } finally {
      await t.cleanup();
    }
  });
});

test("the GSM8K interaction scores the last assistant message as verl's current one does: prefixed with '#### ', flexible (the last number), compared as text", () => {
  const gsm8k = new Gsm8kInteraction();
  const reply = (content: string) => gsm8k.respond('i', [{ role: 'user', content: 'q' }, { role: 'assistant', content }], { ground_truth: '18' });
  assert.deepEqual([reply('18').terminate, reply('18').reward, reply('18').content], [true, 1, 'Your response is correct!']); // a bare number becomes "#### 18"
  assert.equal(reply('so 3 + 15\n#### 18').reward, 1);
  // Flexible: the last number counts wherever it is (the strict rule of verl before July 2025 gave these 0).
  assert.equal(reply('3 + 15 makes 18 apples').reward, 1);
  assert.equal(reply('#### 17, no wait, it is 18').reward, 1);
  assert.equal(reply('it is 18, not 17').reward, 0);
  assert.equal(reply('#### 18.00').reward, 0); // strings, not numbers
  assert.equal(reply('The answer is 18.').reward, 0); // verl's number class takes the final dot: "18." is not "18"
  assert.deepEqual([reply('#### 17').terminate, reply('#### 17').content], [false, 'Your response is incorrect! You need to reflect on your answer and try again.']);
  assert.equal(reply('no idea').reward, 0);
});
