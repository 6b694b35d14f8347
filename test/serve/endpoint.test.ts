// The OpenAI-compatible endpoint over real HTTP, the calculator's tokenizer and chat template and the embedded
// log, with the scripted backend (a TEST DOUBLE: it answers a fixed script) so every turn is known: a multi-turn
// tool-calling trajectory recorded as the usual events, groups, completion with and without reward, the idle
// time-out, streaming, and each refusal (auth, history, tool calls, limits).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TOPICS } from '../../core/topics.ts';
import { ScriptedBackend } from '../../producers/backends/scripted.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { compareTokens } from '../../producers/tokenizer/delta.ts';
import type { ToolCallCompleted, TrajectoryCompleted, TrajectoryStarted, TurnCompleted } from '../../schemas/generated/types.ts';
import { call, startServe, topicEvents } from './helpers.ts';
import type { ServeJob } from '../../cli/run/serve-job.ts';

interface WireChoice {
  finish_reason: string;
  message: { role: string; content: string | null; tool_calls: { id: string; type: string; function: { name: string; arguments: string } }[] };
  logprobs: { content: unknown[] } | null;
  rlstream: { trajectory_id: string; group_id: string; turn_index: number; token_ids: number[] };
}

const TOKENIZER = ChatTokenizer.load(new URL('../../examples/calculator/tokenizer', import.meta.url).pathname);
const CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>';
const CALCULATOR = { type: 'function', function: { name: 'calculator', description: 'Exact arithmetic.', parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } } };
const PROMPT = [
  { role: 'system', content: 'Use the calculator, then answer.' },
  { role: 'user', content: 'Tom has 2 apples. Tom gets 3 more. How many apples does Tom have now?' },
];

describe('rlstream serve (scripted backend)', () => {
  let job: ServeJob;
  let stop: () => Promise<void>;
  // A backend that returns no alternatives (as the CUDA policy, SGLang and vLLM backends).
  const scripted = new ScriptedBackend({ tokenizer: TOKENIZER, script: ({ turn }) => (turn === 0 ? CALL : 'The answer is 5.'), maxTopLogprobs: 0 });

  before(async () => {
    ({ job, stop } = await startServe({ wrapBackend: () => scripted, limits: { maxSessions: 6, idleTimeoutMs: 5_000 }, bodyLimitBytes: 64 * 1024 }));
  });
  after(async () => stop());

  it('needs a bearer token on every route but /openapi.json, which documents them all', async () => {
    for (const [method, path] of [['GET', '/v1/models'], ['POST', '/v1/chat/completions'], ['POST', '/v1/completions'], ['POST', '/v1/trajectories/x/complete'], ['GET', '/nope']]) {
      const res = await fetch(job.url + path!, { method: method!, headers: { authorization: 'Bearer wrong-token-0123456789' } });
      assert.equal(res.status, 401, `${method} ${path}`);
      const body = (await res.json()) as { error: { code: string; type: string } };
      assert.equal(body.error.code, 'SRV_ERR_UNAUTHENTICATED');
      assert.equal(body.error.type, 'authentication_error');
    }
    const doc = await fetch(job.url + '/openapi.json');
    assert.equal(doc.status, 200);
    const spec = (await doc.json()) as { paths: Record<string, unknown> };
    for (const p of ['/v1/chat/completions', '/v1/completions', '/v1/models', '/v1/trajectories/{id}/complete']) assert.ok(spec.paths[p], p);
    const models = await call(job, 'GET', '/v1/models');
    assert.deepEqual((models.json['data'] as { id: string }[]).map((m) => m.id), ['calculator']);
  });

  it('alternatives from a backend that computes none, or a call forced with no tool to call: 400 naming the field, nothing opened', async () => {
    const sessions = job.service.openSessions;
    const cases: [string, Record<string, unknown>, string, RegExp][] = [
      ['/v1/chat/completions', { model: 'calculator', messages: PROMPT, logprobs: true, top_logprobs: 1 }, 'top_logprobs', /the scripted backend returns no alternatives/],
      ['/v1/completions', { model: 'calculator', prompt: 'Say hi', logprobs: 1 }, 'logprobs', /the scripted backend returns no alternatives/],
      ['/v1/chat/completions', { model: 'calculator', messages: PROMPT, tool_choice: 'required' }, 'tool_choice', /declares no tools/],
    ];
    for (const [path, body, param, message] of cases) {
      const res = await call(job, 'POST', path, body);
      assert.equal(res.status, 400, res.text);
      const err = res.json['error'] as { param: string; message: string };
      assert.equal(err.param, param);
      assert.match(err.message, message);
    }
    assert.equal(job.service.openSessions, sessions);
    // logprobs 0 asks for no alternatives: honoured on any backend.
    assert.equal((await call(job, 'POST', '/v1/completions', { model: 'calculator', prompt: 'Say hi', logprobs: 0, max_tokens: 2 })).status, 200);
  });

  it('records a multi-turn tool-calling conversation as one trajectory of the usual events', async () => {
    const first = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: PROMPT, tools: [CALCULATOR], logprobs: true, metadata: { ground_truth: '5', data_source: 'rlstream/calculator' } });
    assert.equal(first.status, 200, first.text);
    const choice = (first.json['choices'] as WireChoice[])[0]!;
    assert.equal(choice['finish_reason'], 'tool_calls');
    const msg = choice['message'];
    assert.equal(msg.tool_calls.length, 1);
    assert.equal(msg.tool_calls[0]!.function.name, 'calculator');
    assert.deepEqual(JSON.parse(msg.tool_calls[0]!.function.arguments), { expression: '2+3' });
    const id = choice['rlstream'].trajectory_id as string;
    assert.equal(first.headers.get('x-rlstream-trajectory'), id);
    assert.equal(choice['logprobs']!.content.length, choice['rlstream'].token_ids.length);

    // The client runs the tool and sends the conversation back, unnamed: its history finds the trajectory.
    const history = [...PROMPT, msg, { role: 'tool', tool_call_id: msg.tool_calls[0]!.id, content: '5' }];
    const second = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: history, tools: [CALCULATOR] });
    assert.equal(second.status, 200, second.text);
    const c2 = (second.json['choices'] as WireChoice[])[0]!;
    assert.equal(c2['rlstream'].trajectory_id, id);
    assert.equal(c2['message'].content, 'The answer is 5.');
    assert.equal(c2['rlstream'].turn_index, 2);

    const done = await call(job, 'POST', `/v1/trajectories/${id}/complete`, {});
    assert.equal(done.status, 200, done.text);
    assert.deepEqual({ ...done.json }, { trajectory_id: id, group_id: first.headers.get('x-rlstream-group'), termination: 'stop', num_turns: 3, response_tokens: done.json['response_tokens'], tokenization_mismatches: 0 });
    const again = await call(job, 'POST', `/v1/trajectories/${id}/complete`, {});
    assert.equal(again.status, 409);

    const events = (await topicEvents(job, TOPICS.rolloutEvents)).filter((e) => (e.value as { trajectory_id?: string; trajectory?: { trajectory_id: string } }).trajectory_id === id || (e.value as { trajectory?: { trajectory_id: string } }).trajectory?.trajectory_id === id);
    assert.deepEqual(events.map((e) => e.name), ['TrajectoryStarted', 'TurnCompleted', 'ToolCallCompleted', 'TurnCompleted', 'TurnCompleted', 'TrajectoryCompleted']);
    const started = events[0]!.value as TrajectoryStarted;
    assert.equal(started.dataset.split, 'train');
    assert.equal(started.data_source, 'rlstream/calculator');
    assert.equal(started.ground_truth, '5');
    assert.deepEqual(started.tools.map((t) => t.name), ['calculator']);
    assert.deepEqual(started.prompt_token_ids, TOKENIZER.apply(PROMPT, { tools: [CALCULATOR as never], addGenerationPrompt: true }));
    const turns = events.filter((e) => e.name === 'TurnCompleted').map((e) => e.value as TurnCompleted);
    assert.deepEqual(turns.map((t) => t.role), ['assistant', 'tool', 'assistant']);
    assert.deepEqual(turns[0]!.token_ids, choice['rlstream'].token_ids);
    assert.deepEqual(turns[2]!.token_ids, c2['rlstream'].token_ids);
    assert.ok(turns[1]!.response_mask.every((m) => m === 0) && turns[0]!.response_mask.every((m) => m === 1));
    assert.ok(turns.every((t) => !t.tokenization_mismatch));
    const tool = events[2]!.value as ToolCallCompleted;
    assert.deepEqual([tool.turn_index, tool.call_id, tool.status, tool.result_text], [0, msg.tool_calls[0]!.id, 'ok', '5']);
    const traj = (events[5]!.value as TrajectoryCompleted).trajectory;
    assert.deepEqual(traj.response_ids, turns.flatMap((t) => t.token_ids));
    assert.deepEqual(traj.turn_roles, ['assistant', 'tool', 'assistant']);
    assert.equal(traj.termination, 'stop');
    // The whole recorded context is what the template renders for the conversation (delta tokenization), but
    // for the newline the template writes after an end-of-turn token the model stopped at.
    const rendered = TOKENIZER.apply([...PROMPT, { role: 'assistant', content: CALL }, { role: 'tool', content: '5', tool_call_id: msg.tool_calls[0]!.id, name: 'calculator' }, { role: 'assistant', content: 'The answer is 5.' }], { tools: [CALCULATOR as never] });
    assert.equal(compareTokens(TOKENIZER, 'ignore_strippable', traj.prompt_ids.concat(traj.response_ids), rendered).mismatch, false);
    assert.equal(compareTokens(TOKENIZER, 'ignore_strippable', traj.prompt_ids.concat(traj.response_ids).slice(0, -3), rendered).mismatch, true);
  });

  it('opens a group for n samples, takes an outside reward, and refuses what a trajectory cannot record', async () => {
    const res = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: PROMPT, tools: [CALCULATOR], n: 2 });
    assert.equal(res.status, 200, res.text);
    const choices = res.json['choices'] as WireChoice[];
    assert.equal(choices.length, 2);
    const [a, b] = choices.map((c) => c['rlstream']) as [WireChoice['rlstream'], WireChoice['rlstream']];
    assert.notEqual(a.trajectory_id, b.trajectory_id);
    assert.equal(a.group_id, b.group_id);
    const msg = choices[0]!['message'];

    // A result for a call the trajectory did not make; an edited history; n > 1 on a continued trajectory.
    const named = { 'x-rlstream-trajectory': a.trajectory_id };
    const bad = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: [...PROMPT, msg, { role: 'tool', tool_call_id: 'call_9_9', content: '5' }], tools: [CALCULATOR] }, named);
    assert.equal(bad.status, 400);
    assert.equal((bad.json['error'] as { code: string }).code, 'SRV_ERR_TOOL_CALL');
    const edited = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: [...PROMPT, { ...msg, content: 'something else' }, { role: 'tool', tool_call_id: msg.tool_calls[0]!.id, content: '5' }], tools: [CALCULATOR] }, named);
    assert.equal(edited.status, 409);
    const toolsChanged = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: [...PROMPT, msg, { role: 'tool', tool_call_id: msg.tool_calls[0]!.id, content: '5' }] }, named);
    assert.equal(toolsChanged.status, 400);
    // After the refusals the trajectory goes on as if they had not happened.
    const ok = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: [...PROMPT, msg, { role: 'tool', tool_call_id: msg.tool_calls[0]!.id, content: '5' }], tools: [CALCULATOR] }, named);
    assert.equal(ok.status, 200, ok.text);

    assert.equal((await call(job, 'POST', `/v1/trajectories/${a.trajectory_id}/complete`, { reward: 0.75 })).status, 200);
    assert.equal((await call(job, 'POST', `/v1/trajectories/${b.trajectory_id}/complete`, { reward: -1, termination: 'max_turns' })).status, 200);
    const completed = (await topicEvents(job, TOPICS.rolloutEvents)).filter((e) => e.name === 'TrajectoryCompleted').map((e) => (e.value as TrajectoryCompleted).trajectory).filter((t) => t.group_id === a.group_id);
    assert.deepEqual(completed.map((t) => [t.sample_index, t.group_size, t.external_reward, t.termination]).sort(), [[0, 2, 0.75, 'stop'], [1, 2, -1, 'max_turns']]);
  });

  it('refuses a tool call of a tool the trajectory did not declare, and records it as unknown_tool', async () => {
    const lookup = { type: 'function', function: { name: 'lookup', description: 'Look a word up.', parameters: { type: 'object', properties: { word: { type: 'string' } }, required: ['word'] } } };
    const res = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: PROMPT, tools: [lookup] });
    assert.equal(res.status, 200, res.text);
    const c = (res.json['choices'] as WireChoice[])[0]!;
    assert.equal(c['message'].tool_calls, undefined);
    assert.equal(c['finish_reason'], 'stop');
    const id = c['rlstream'].trajectory_id;
    await call(job, 'POST', `/v1/trajectories/${id}/complete`, {});
    const events = await topicEvents(job, TOPICS.rolloutEvents);
    const tool = events.find((e) => e.name === 'ToolCallCompleted' && (e.value as ToolCallCompleted).trajectory_id === id)!.value as ToolCallCompleted;
    assert.equal(tool.tool_name, 'calculator');
    assert.equal(tool.status, 'unknown_tool');
    const traj = events.find((e) => e.name === 'TrajectoryCompleted' && (e.value as TrajectoryCompleted).trajectory.trajectory_id === id)!.value as TrajectoryCompleted;
    assert.equal(traj.trajectory.num_invalid_tool_calls, 1);
  });

  it('streams a turn as server-sent events in the OpenAI chunk shape', async () => {
    const res = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: PROMPT, tools: [CALCULATOR], stream: true });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /text\/event-stream/);
    const data = res.text.split('\n\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
    assert.equal(data.at(-1), '[DONE]');
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d) as { choices: { delta?: { tool_calls?: { function: { name: string } }[] }; finish_reason: string | null; rlstream?: { trajectory_id: string } }[] });
    assert.equal(chunks[0]!.choices[0]!.delta!.tool_calls![0]!.function.name, 'calculator');
    assert.equal(chunks[1]!.choices[0]!.finish_reason, 'tool_calls');
    await call(job, 'POST', `/v1/trajectories/${chunks[1]!.choices[0]!.rlstream!.trajectory_id}/complete`, {});
  });

  it('records a text completion as a trajectory of one turn, without a chat template', async () => {
    const prompt = 'The answer to 2+3 is';
    const res = await call(job, 'POST', '/v1/completions', { model: 'calculator', prompt, max_tokens: 8, logprobs: 0 });
    assert.equal(res.status, 200, res.text);
    const c = (res.json['choices'] as { text: string; logprobs: { token_logprobs: number[] }; rlstream: WireChoice['rlstream'] }[])[0]!;
    // The script's first turn, cut at max_tokens.
    assert.ok(c.text.length > 0 && CALL.startsWith(c.text), c.text);
    assert.equal(c.logprobs.token_logprobs.length, c.rlstream.token_ids.length);
    assert.equal((await call(job, 'POST', `/v1/trajectories/${c.rlstream.trajectory_id}/complete`, { reward: 1 })).status, 200);
    const started = (await topicEvents(job, TOPICS.rolloutEvents)).find((e) => e.name === 'TrajectoryStarted' && (e.value as TrajectoryStarted).trajectory_id === c.rlstream.trajectory_id)!.value as TrajectoryStarted;
    assert.deepEqual(started.prompt_token_ids, TOKENIZER.encode(prompt));
    // The call names no data_source: it is recorded with the task's one reward source, so the reward consumer scores it.
    assert.equal(started.data_source, 'rlstream/calculator');
    const again = await call(job, 'POST', '/v1/completions', { model: 'calculator', prompt }, { 'x-rlstream-trajectory': c.rlstream.trajectory_id });
    assert.equal(again.status, 409);
  });

  it('limits bodies and open trajectories, and completes idle ones as aborted', async () => {
    const big = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: [{ role: 'user', content: 'x'.repeat(70 * 1024) }] });
    assert.equal(big.status, 413);
    const wrongModel = await call(job, 'POST', '/v1/chat/completions', { model: 'gpt-4o', messages: PROMPT });
    assert.equal(wrongModel.status, 404);
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) {
      const r = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: PROMPT, tools: [CALCULATOR] });
      if (r.status === 429) break;
      ids.push(((r.json['choices'] as WireChoice[])[0]!['rlstream'] as { trajectory_id: string }).trajectory_id);
    }
    const full = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: PROMPT, tools: [CALCULATOR] });
    assert.equal(full.status, 429);
    assert.equal((full.json['error'] as { code: string }).code, 'SRV_ERR_SESSIONS_FULL');
    // Idle past the time-out (5 s here, long enough that the other tests' trajectories outlive a loaded machine's
    // pauses): the sweeper completes them as aborted, freeing room.
    await new Promise((r) => setTimeout(r, 6_500));
    const late = await call(job, 'POST', `/v1/trajectories/${ids[0]}/complete`, {});
    assert.equal(late.status, 409);
    assert.match((late.json['error'] as { message: string }).message, /aborted/);
    const completed = (await topicEvents(job, TOPICS.rolloutEvents)).filter((e) => e.name === 'TrajectoryCompleted').map((e) => (e.value as TrajectoryCompleted).trajectory);
    for (const id of ids) assert.equal(completed.find((t) => t.trajectory_id === id)?.termination, 'aborted');
    assert.equal((await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: PROMPT, tools: [CALCULATOR] })).status, 200);
  });
  // Last: it locks this client address out for a minute.
  it('answers 429 to a client after 30 failed authentications, before checking its token', async () => {
    let last = 0;
    for (let i = 0; i < 31; i++) last = (await fetch(job.url + '/v1/models', { headers: { authorization: `Bearer guess-${i}-0123456789` } })).status;
    assert.equal(last, 429);
    const valid = await call(job, 'GET', '/v1/models');
    assert.equal(valid.status, 429);
    assert.equal((valid.json['error'] as { code: string }).code, 'SRV_ERR_AUTH_LIMITED');
  });
});
