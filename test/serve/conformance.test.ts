// OpenAI conformance of `rlstream serve`, over real HTTP with the calculator's tokenizer and chat template and the
// embedded log, the scripted backend a TEST DOUBLE that answers a fixed script (so every turn is known). It walks
// every field of OpenAI's chat/completions and completions requests (the reference's list, written out below)
// and asserts each is honoured (its effect checked) or refused with 400 naming it; out-of-range numbers are
// refused before a trajectory opens, a failed call frees its slot, and no event is written for a trajectory that
// never started (every TrajectoryCompleted in the log has its TrajectoryStarted, shutdown included).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TOPICS } from '../../core/topics.ts';
import { ScriptedBackend } from '../../producers/backends/scripted.ts';
import { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import type { TrajectoryCompleted, TrajectoryStarted, TurnCompleted } from '../../schemas/generated/types.ts';
import type { ServeJob } from '../../cli/run/serve-job.ts';
import { call, startServe, topicEvents } from './helpers.ts';

const TOKENIZER = ChatTokenizer.load(new URL('../../examples/calculator/tokenizer', import.meta.url).pathname);
const TWO_CALLS = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3", "note": "a"}}\n</tool_call>\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>';
const ANSWER = 'The answer is 5. STOP-HERE and then some more text.';
const CALCULATOR = { type: 'function', function: { name: 'calculator', description: 'Exact arithmetic.', parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] } } };
const PROMPT = [
  { role: 'system', content: 'Use the calculator, then answer.' },
  { role: 'user', content: 'Tom has 2 apples. Tom gets 3 more. How many apples does Tom have now?' },
];
const BASE = { model: 'calculator', messages: PROMPT, tools: [CALCULATOR] };

interface Choice {
  finish_reason: string;
  message: { role: string; content: string | null; tool_calls?: { id: string; type: string; function: { name: string; arguments: string } }[] };
  logprobs: { content: { logprob: number }[] } | null;
  rlstream: { trajectory_id: string; group_id: string; token_ids: number[] };
}
type Res = Awaited<ReturnType<typeof call>>;
const choices = (r: Res) => r.json['choices'] as Choice[];
const sse = (r: Res) =>
  r.text
    .split('\n\n')
    .filter((l) => l.startsWith('data: '))
    .map((l) => l.slice(6));

const ANSWER_PROMPT = [PROMPT[0], { role: 'user', content: 'Just answer: how many apples?' }];
const CLOCK = { type: 'function', function: { name: 'clock', description: 'The time.' } };

interface Alternatives {
  token: string;
  logprob: number;
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

/** The first choice of a streamed chat answer, its deltas' fields put together. */
function streamedChoice(r: Res): Choice {
  const chunks = sse(r).slice(0, -1).map((d) => JSON.parse(d) as { choices: (Choice & { delta: Record<string, unknown> })[] });
  const first = chunks[0]!.choices[0]!;
  const last = chunks[1]!.choices[0]!;
  return { ...last, message: first.delta as Choice['message'], logprobs: first.logprobs };
}

/** k alternatives per sampled token, most probable first, within a distribution (their mass at most 1). */
function checkAlternatives(c: Choice, k: number): void {
  const content = c.logprobs!.content as unknown as Alternatives[];
  assert.ok(content.length > 0);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, k);
    for (let i = 1; i < k; i++) assert.ok(t.top_logprobs[i - 1]!.logprob >= t.top_logprobs[i]!.logprob);
    assert.ok(t.top_logprobs[0]!.logprob >= t.logprob);
    assert.ok(t.top_logprobs.reduce((a, x) => a + Math.exp(x.logprob), 0) <= 1 + 1e-6);
    assert.deepEqual(t.top_logprobs[0]!.bytes, [...Buffer.from(t.top_logprobs[0]!.token, 'utf8')]);
  }
}

/** The legacy completions shape: per returned token a map of k alternative texts to log-probs. */
function checkLegacyAlternatives(c: Choice, k: number): void {
  const lp = c.logprobs as unknown as { tokens: string[]; token_logprobs: number[]; top_logprobs: Record<string, number>[] };
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  for (const [i, alts] of lp.top_logprobs.entries()) {
    const values = Object.values(alts);
    assert.ok(values.length >= 1 && values.length <= k);
    assert.ok(Math.max(...values) >= lp.token_logprobs[i]!);
  }
}

/** A forced call: its opening is the forced tokens (recorded, not sampled), the rest a valid call of a declared tool. */
function checkForced(c: Choice, opening: string): void {
  assert.equal(c.finish_reason, 'tool_calls');
  const ext = c.rlstream as Choice['rlstream'] & { forced_tokens: number };
  assert.ok(ext.forced_tokens > 0);
  assert.equal(TOKENIZER.decode(ext.token_ids.slice(0, ext.forced_tokens)), opening);
  const calls = c.message.tool_calls!;
  assert.equal(calls.length, 1);
  assert.ok(['calculator', 'clock'].includes(calls[0]!.function.name));
  assert.equal(typeof JSON.parse(calls[0]!.function.arguments), 'object');
}

/** OpenAI's chat/completions request fields (API reference), each with values honoured and values refused. */
interface FieldCase {
  /** Values merged into a valid request that must answer 200, and what to check on the answer. */
  ok?: { value: unknown; extra?: Record<string, unknown>; check?: (r: Res) => void }[];
  /** Values that must answer 400 naming this field. */
  refused?: unknown[];
}

const CHAT: Record<string, FieldCase> = {
  messages: { ok: [{ value: [{ role: 'developer', content: [{ type: 'text', text: 'Answer.' }] }, { role: 'user', content: 'Hi', name: 'tom' }], extra: { tools: null } }], refused: [[], 'hi', [{ role: 'user', content: 5 }], [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }], [{ role: 'robot', content: 'x' }]] },
  model: { refused: [5, null] },
  audio: { refused: [{ voice: 'alloy', format: 'wav' }, null] },
  frequency_penalty: { ok: [{ value: 0 }, { value: null }], refused: [0.5, -2, '0'] },
  presence_penalty: { ok: [{ value: 0 }], refused: [1] },
  function_call: { refused: ['auto'] },
  functions: { refused: [[{ name: 'calculator' }]] },
  logit_bias: { ok: [{ value: {} }], refused: [{ '50256': -100 }] },
  logprobs: {
    ok: [
      { value: true, check: (r) => assert.equal(choices(r)[0]!.logprobs!.content.length, choices(r)[0]!.rlstream.token_ids.length) },
      { value: false, check: (r) => assert.equal(choices(r)[0]!.logprobs, null) },
    ],
    refused: ['yes', 1],
  },
  top_logprobs: {
    ok: [
      { value: 0, extra: { logprobs: true }, check: (r) => assert.ok(choices(r)[0]!.logprobs!.content.every((t) => (t as unknown as Alternatives).top_logprobs.length === 0)) },
      { value: 3, extra: { logprobs: true }, check: (r) => checkAlternatives(choices(r)[0]!, 3) },
      { value: 20, extra: { logprobs: true, stream: true }, check: (r) => checkAlternatives(streamedChoice(r), 20) },
    ],
    // 2 without logprobs: true is refused too (the walk sends no logprobs).
    refused: [21, -1, 1.5, 2],
  },
  max_tokens: { ok: [{ value: 3, check: (r) => assert.equal(choices(r)[0]!.rlstream.token_ids.length, 3) }], refused: [0, -1, 2 ** 31, 2 ** 70, 1.5, '8'] },
  max_completion_tokens: { ok: [{ value: 2, check: (r) => assert.equal(choices(r)[0]!.finish_reason, 'length') }], refused: [0, 2 ** 31] },
  metadata: { ok: [{ value: { data_source: 'rlstream/calculator' } }], refused: [{ n: 5 }, 'x'] },
  modalities: { ok: [{ value: ['text'] }], refused: [['text', 'audio'], ['audio']] },
  n: {
    ok: [
      {
        value: 3,
        check: (r) => {
          assert.equal(choices(r).length, 3);
          assert.equal(new Set(choices(r).map((c) => c.rlstream.group_id)).size, 1);
        },
      },
    ],
    refused: [0, 65, -1, 2.5, '2'],
  },
  parallel_tool_calls: {
    ok: [
      { value: false, extra: { messages: [...PROMPT.slice(0, 1), { role: 'user', content: 'TWO CALLS please' }] }, check: (r) => assert.equal(choices(r)[0]!.message.tool_calls!.length, 1) },
      { value: true, extra: { messages: [...PROMPT.slice(0, 1), { role: 'user', content: 'TWO CALLS please' }] }, check: (r) => assert.equal(choices(r)[0]!.message.tool_calls!.length, 2) },
    ],
    refused: ['no'],
  },
  prediction: { refused: [{ type: 'content', content: 'x' }] },
  prompt_cache_key: { ok: [{ value: 'k1' }], refused: [5] },
  reasoning_effort: { ok: [{ value: null }], refused: ['low'] },
  response_format: { ok: [{ value: { type: 'text' } }], refused: [{ type: 'json_object' }, { type: 'json_schema', json_schema: { name: 'x' } }] },
  safety_identifier: { ok: [{ value: 'user-1' }], refused: [5] },
  seed: { ok: [{ value: 7 }, { value: -7 }, { value: 2 ** 53 - 2 }, { value: -(2 ** 53 - 2) }], refused: [2 ** 64, 2 ** 53 - 1, -(2 ** 53 - 1), 1.5, '7'] },
  service_tier: { ok: [{ value: 'auto' }], refused: ['flex', 'priority'] },
  stop: {
    ok: [
      { value: 'STOP-HERE', extra: { tools: null }, check: (r) => assert.equal(choices(r)[0]!.message.content, 'The answer is 5. ') },
      { value: ['zzz', 'answer is'], extra: { tools: null }, check: (r) => assert.equal(choices(r)[0]!.message.content, 'The ') },
      { value: 'never-generated', extra: { tools: null }, check: (r) => assert.equal(choices(r)[0]!.message.content, ANSWER) },
    ],
    refused: [['a', 'b', 'c', 'd', 'e'], '', 5],
  },
  store: { ok: [{ value: true }], refused: [false] },
  stream: {
    ok: [
      { value: true, check: (r) => assert.ok(sse(r).slice(0, -1).every((d) => (JSON.parse(d) as { choices: unknown[] }).choices.length > 0), 'no usage chunk without include_usage') },
      { value: false, check: (r) => assert.ok(Array.isArray(r.json['choices'])) },
    ],
    refused: ['yes'],
  },
  stream_options: {
    ok: [
      {
        value: { include_usage: true },
        extra: { stream: true },
        check: (r) => {
          const chunks = sse(r).slice(0, -1).map((d) => JSON.parse(d) as { choices: unknown[]; usage: { total_tokens: number } | null });
          assert.equal(chunks.at(-1)!.choices.length, 0);
          assert.ok(chunks.at(-1)!.usage!.total_tokens > 0);
          assert.ok(chunks.slice(0, -1).every((c) => c.usage === null && c.choices.length > 0));
        },
      },
    ],
    refused: [{ include_usage: 'yes' }, { include_obfuscation: true }, { other: 1 }],
  },
  temperature: { ok: [{ value: 0 }, { value: 2 }], refused: [2.5, -0.1, '1'] },
  tool_choice: {
    ok: [
      { value: 'auto', check: (r) => assert.equal(choices(r)[0]!.finish_reason, 'tool_calls') },
      { value: 'none', check: (r) => assert.ok(choices(r)[0]!.message.tool_calls === undefined && choices(r)[0]!.message.content!.includes('<tool_call>')) },
      // A prompt the script answers with text: the forced opening makes it a call all the same.
      { value: 'required', extra: { messages: ANSWER_PROMPT }, check: (r) => checkForced(choices(r)[0]!, '<tool_call>\n{"name": "calculator", "arguments":') },
      { value: { type: 'function', function: { name: 'calculator' } }, extra: { messages: ANSWER_PROMPT }, check: (r) => checkForced(choices(r)[0]!, '<tool_call>\n{"name": "calculator", "arguments":') },
      // Two tools: required forces the opening up to the name, and the policy names one.
      { value: 'required', extra: { messages: ANSWER_PROMPT, tools: [CALCULATOR, CLOCK] }, check: (r) => checkForced(choices(r)[0]!, '<tool_call>\n{"name": "') },
    ],
    refused: ['sometimes', { type: 'function', function: { name: 'clock' } }, { type: 'function', function: { name: 'calculator', strict: true } }, { type: 'function' }],
  },
  tools: {
    ok: [
      // Optional keys left out (no description, no required, no parameters at all).
      { value: [{ type: 'function', function: { name: 'calculator', parameters: { type: 'object', properties: { expression: { type: 'string' } } } } }], check: (r) => assert.equal(choices(r)[0]!.finish_reason, 'tool_calls') },
      { value: [{ type: 'function', function: { name: 'calculator', strict: true } }] },
    ],
    refused: [[{ type: 'retrieval' }], [{ type: 'function', function: { name: 'a b' } }], [CALCULATOR, CALCULATOR]],
  },
  top_p: { ok: [{ value: 1 }, { value: 0.5 }], refused: [0, 1.5] },
  user: { ok: [{ value: 'someone' }], refused: [5] },
  verbosity: { ok: [{ value: null }], refused: ['low'] },
  web_search_options: { refused: [{}] },
  // Not OpenAI's: rlstream's extension, and what some servers take that this one does not.
  top_k: { ok: [{ value: 5 }], refused: [1e12, -1] },
  min_p: { refused: [0.1] },
};

const COMPLETIONS: Record<string, FieldCase> = {
  prompt: {
    ok: [
      {
        value: ['The answer to 2+3 is', 'Say hi'],
        extra: { n: 2 },
        check: (r) => {
          // One group of n per prompt, choice index = prompt index × n + sample.
          assert.equal(choices(r).length, 4);
          const groups = choices(r).map((c) => c.rlstream.group_id);
          assert.ok(groups[0] === groups[1] && groups[2] === groups[3] && groups[0] !== groups[2]);
        },
      },
    ],
    refused: [[1, 2, 3], [], 5],
  },
  model: { refused: [5] },
  best_of: { ok: [{ value: 1 }], refused: [2] },
  echo: { ok: [{ value: false }], refused: [true] },
  frequency_penalty: { ok: [{ value: 0 }], refused: [1] },
  logit_bias: { ok: [{ value: {} }], refused: [{ '1': 5 }] },
  logprobs: {
    ok: [
      { value: 0, check: (r) => assert.ok((choices(r)[0]!.logprobs as unknown as { text_offset: number[] }).text_offset.length > 0) },
      { value: 5, check: (r) => checkLegacyAlternatives(choices(r)[0]!, 5) },
      { value: 2, extra: { stream: true }, check: (r) => checkLegacyAlternatives(JSON.parse(sse(r)[0]!).choices[0] as Choice, 2) },
    ],
    refused: [6, 21, -1, 'x'],
  },
  max_tokens: { ok: [{ value: 4, check: (r) => assert.equal(choices(r)[0]!.rlstream.token_ids.length, 4) }], refused: [0, 2 ** 40] },
  n: { ok: [{ value: 2, check: (r) => assert.equal(choices(r).length, 2) }], refused: [0] },
  presence_penalty: { ok: [{ value: 0 }], refused: [0.1] },
  seed: { ok: [{ value: 1 }], refused: [2 ** 64] },
  stop: { ok: [{ value: 'STOP-HERE', check: (r) => assert.equal((choices(r)[0] as unknown as { text: string }).text, 'The answer is 5. ') }], refused: [['1', '2', '3', '4', '5']] },
  stream: {
    ok: [{ value: true, check: (r) => assert.ok(sse(r).slice(0, -1).some((d) => ((JSON.parse(d) as { choices: { text: string }[] }).choices[0]?.text ?? '').startsWith('The answer'))) }],
    refused: [1],
  },
  stream_options: { ok: [{ value: { include_usage: true }, extra: { stream: true }, check: (r) => assert.equal((JSON.parse(sse(r).at(-2)!) as { choices: unknown[] }).choices.length, 0) }], refused: [{ include_usage: true }] },
  suffix: { ok: [{ value: null }], refused: ['end'] },
  temperature: { ok: [{ value: 1 }], refused: [3] },
  top_p: { ok: [{ value: 1 }], refused: [0] },
  user: { ok: [{ value: 'u' }], refused: [[]] },
};

/** OpenAI's own field lists (API reference, chat/completions and completions). */
const OPENAI_CHAT_FIELDS = 'messages model audio frequency_penalty function_call functions logit_bias logprobs max_completion_tokens max_tokens metadata modalities n parallel_tool_calls prediction presence_penalty prompt_cache_key reasoning_effort response_format safety_identifier seed service_tier stop store stream stream_options temperature tool_choice tools top_logprobs top_p user verbosity web_search_options'.split(' ');
const OPENAI_COMPLETION_FIELDS = 'model prompt best_of echo frequency_penalty logit_bias logprobs max_tokens n presence_penalty seed stop stream stream_options suffix temperature top_p user'.split(' ');

describe('rlstream serve: OpenAI conformance and refusals before a trajectory opens', () => {
  let job: ServeJob;
  let stop: () => Promise<void>;
  const scripted = new ScriptedBackend({
    tokenizer: TOKENIZER,
    script: ({ turn, promptText }) => {
      const text = promptText();
      if (text.includes('FAIL')) throw new Error('the backend is down');
      if (text.includes('TWO CALLS')) return TWO_CALLS;
      // Continuations of a forced call's opening (tool_choice required / named); BAD ARGS writes no JSON.
      if (text.endsWith('"arguments":')) return text.includes('BAD ARGS') ? ' expression=2+3}\n</tool_call>' : ' {"expression": "2+3"}}\n</tool_call>';
      if (text.endsWith('{"name": "')) return 'calculator", "arguments": {"expression": "2+3"}}\n</tool_call>';
      return turn === 0 && text.includes('# Tools') ? '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>' : ANSWER;
    },
  });

  before(async () => {
    ({ job, stop } = await startServe({ wrapBackend: () => scripted, limits: { maxSessions: 2000, idleTimeoutMs: 600_000 } }));
  });
  after(async () => stop());

  const walk = async (path: string, base: Record<string, unknown>, table: Record<string, FieldCase>, fields: string[]) => {
    for (const f of fields) assert.ok(table[f], `OpenAI's field ${f} has no case`);
    for (const [field, c] of Object.entries(table)) {
      for (const ok of c.ok ?? []) {
        const res = await call(job, 'POST', path, { ...base, ...ok.extra, [field]: ok.value });
        assert.equal(res.status, 200, `${field}=${JSON.stringify(ok.value)}: ${res.text}`);
        ok.check?.(res);
      }
      for (const value of c.refused ?? []) {
        const before = job.service.openSessions;
        const res = await call(job, 'POST', path, { ...base, [field]: value });
        assert.equal(res.status, 400, `${field}=${JSON.stringify(value)} was not refused: ${res.text.slice(0, 300)}`);
        const err = res.json['error'] as { param: string; message: string; code: string };
        assert.equal(err.code, 'SRV_ERR_VALIDATION', res.text);
        assert.ok(err.param === field || err.param.startsWith(`${field}.`) || err.param.startsWith(`${field}[`), `${field}=${JSON.stringify(value)}: param ${err.param} (${err.message})`);
        assert.ok(err.message.includes(field), err.message);
        assert.equal(job.service.openSessions, before, `${field}=${JSON.stringify(value)} opened a trajectory`);
      }
    }
  };

  it('chat/completions: every OpenAI field is honoured or refused by name', async () => {
    await walk('/v1/chat/completions', BASE, CHAT, OPENAI_CHAT_FIELDS);
  });

  it('completions: every OpenAI field is honoured or refused by name', async () => {
    await walk('/v1/completions', { model: 'calculator', prompt: 'The answer to 2+3 is' }, COMPLETIONS, OPENAI_COMPLETION_FIELDS);
  });

  it('models.retrieve answers the served model and 404 for another', async () => {
    const ok = await call(job, 'GET', '/v1/models/calculator');
    assert.deepEqual(ok.json, { id: 'calculator', object: 'model', created: 0, owned_by: 'rlstream' });
    const other = await call(job, 'GET', '/v1/models/gpt-4o');
    assert.equal(other.status, 404);
    assert.equal((other.json['error'] as { param: string }).param, 'model');
  });

  it('out-of-range numbers are refused before a trajectory opens, and write nothing', async () => {
    const count = async () => (await topicEvents(job, TOPICS.rolloutEvents)).length;
    const events = await count();
    const sessions = job.service.openSessions;
    for (const [field, value] of [['seed', 2 ** 64], ['max_tokens', 2 ** 70], ['top_k', 1e12], ['max_completion_tokens', 2 ** 31], ['temperature', 1e300], ['n', 1e6]] as const) {
      const res = await call(job, 'POST', '/v1/chat/completions', { ...BASE, [field]: value });
      assert.equal(res.status, 400, `${field}: ${res.text}`);
      assert.equal((res.json['error'] as { param: string }).param, field);
    }
    // A number written with an exponent that JSON.parse reads as a huge integer.
    const raw = await call(job, 'POST', '/v1/chat/completions', `{"model":"calculator","messages":[{"role":"user","content":"x"}],"seed":18446744073709551616}`);
    assert.equal(raw.status, 400);
    assert.equal(job.service.openSessions, sessions);
    assert.equal(await count(), events);
  });

  it('a failed call frees its slots and writes no event; a named group gets its sample indices back', async () => {
    const events = (await topicEvents(job, TOPICS.rolloutEvents)).length;
    const sessions = job.service.openSessions;
    const fail = [...PROMPT.slice(0, 1), { role: 'user', content: 'FAIL now' }];
    for (const n of [1, 3]) {
      const res = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: fail, n });
      assert.equal(res.status, 503, res.text);
    }
    const named = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: fail }, { 'x-rlstream-trajectory': 'named-fail-1' });
    assert.equal(named.status, 503);
    assert.equal(job.service.openSessions, sessions);
    assert.equal((await topicEvents(job, TOPICS.rolloutEvents)).length, events);
    // The same name works once the backend does: the failed call left nothing behind.
    const retry = await call(job, 'POST', '/v1/chat/completions', BASE, { 'x-rlstream-trajectory': 'named-fail-1' });
    assert.equal(retry.status, 200, retry.text);
    // A named group of 2: the failed first sample's index is given back, so the two that succeed are 0 and 1.
    const g = { 'x-rlstream-group': 'group-fail-1', 'x-rlstream-group-size': '2' };
    assert.equal((await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: fail }, g)).status, 503);
    const a = await call(job, 'POST', '/v1/chat/completions', BASE, g);
    const b = await call(job, 'POST', '/v1/chat/completions', BASE, g);
    assert.equal(a.status, 200, a.text);
    assert.equal(b.status, 200, b.text);
    const started = (await topicEvents(job, TOPICS.rolloutEvents)).filter((e) => e.name === 'TrajectoryStarted').map((e) => e.value as TrajectoryStarted).filter((s) => s.group_id === 'group-fail-1');
    assert.deepEqual(started.map((s) => s.sample_index).sort(), [0, 1]);
  });

  it('a conversation continues its trajectory whatever client re-serialised it: arguments as values, content parts, null content', async () => {
    // As clients send the policy's call back: arguments re-serialised (LangChain's spacing, another key order,
    // indentation), content null, '' or an empty list of parts, the tool result as a text part.
    const variants: ((c: { id: string; function: { arguments: string } }) => Record<string, unknown>)[] = [
      (c) => ({ role: 'assistant', content: null, tool_calls: [{ ...c, function: { ...c.function, arguments: JSON.stringify(JSON.parse(c.function.arguments), null, 2) } }] }),
      (c) => ({ role: 'assistant', content: '', tool_calls: [{ id: c.id, type: 'function', function: { name: 'calculator', arguments: '{ "expression" : "2+3" }' } }] }),
      (c) => ({ role: 'assistant', content: [], tool_calls: [{ id: c.id, function: { arguments: ' {"expression":"2+3"}', name: 'calculator' } }] }),
    ];
    for (const [i, variant] of variants.entries()) {
      const first = await call(job, 'POST', '/v1/chat/completions', BASE);
      const c = choices(first)[0]!;
      const callMsg = c.message.tool_calls![0]!;
      const res = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: [...PROMPT, variant(callMsg), { role: 'tool', tool_call_id: callMsg.id, content: [{ type: 'text', text: '5' }] }] });
      assert.equal(res.status, 200, res.text);
      assert.equal(choices(res)[0]!.rlstream.trajectory_id, c.rlstream.trajectory_id, `variant ${i} opened another trajectory`);
      // The continued turn's context is the recorded ids: the generated tool call's tokens, never re-rendered.
      const events = await topicEvents(job, TOPICS.rolloutEvents);
      const turns = events.filter((e) => e.name === 'TurnCompleted').map((e) => e.value as TurnCompleted).filter((t) => t.trajectory_id === c.rlstream.trajectory_id);
      assert.deepEqual(turns.map((t) => t.role), ['assistant', 'tool', 'assistant']);
      assert.deepEqual(turns[0]!.token_ids, c.rlstream.token_ids);
      const started = events.find((e) => e.name === 'TrajectoryStarted' && (e.value as TrajectoryStarted).trajectory_id === c.rlstream.trajectory_id)!.value as TrajectoryStarted;
      const context = scripted.requests.filter((r) => r.sessionId === c.rlstream.trajectory_id).at(-1)!.promptIds;
      assert.deepEqual(context, [...started.prompt_token_ids, ...turns[0]!.token_ids, ...turns[1]!.token_ids]);
    }
    // A different value is a different conversation: a new trajectory.
    const first = await call(job, 'POST', '/v1/chat/completions', BASE);
    const callMsg = choices(first)[0]!.message.tool_calls![0]!;
    const other = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: [...PROMPT, { role: 'assistant', content: null, tool_calls: [{ ...callMsg, function: { name: 'calculator', arguments: '{"expression": "2+4"}' } }] }, { role: 'tool', tool_call_id: callMsg.id, content: '6' }] });
    assert.equal(other.status, 200, other.text);
    assert.notEqual(choices(other)[0]!.rlstream.trajectory_id, choices(first)[0]!.rlstream.trajectory_id);
  });

  it('a forced call is recorded with its forced tokens masked; a policy that then writes no valid call fails the call (500 model_error) and ends its trajectory', async () => {
    const named = { type: 'function', function: { name: 'calculator' } };
    const ok = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: ANSWER_PROMPT, tool_choice: named, logprobs: true });
    assert.equal(ok.status, 200, ok.text);
    const c = choices(ok)[0]!;
    const forced = (c.rlstream as unknown as { forced_tokens: number }).forced_tokens;
    // Log-probs are the sampled tokens' only.
    assert.equal(c.logprobs!.content.length, c.rlstream.token_ids.length - forced);
    let events = await topicEvents(job, TOPICS.rolloutEvents);
    const turn = events.filter((e) => e.name === 'TurnCompleted').map((e) => e.value as TurnCompleted).find((t) => t.trajectory_id === c.rlstream.trajectory_id)!;
    assert.deepEqual(turn.token_ids, c.rlstream.token_ids);
    assert.deepEqual(turn.response_mask, turn.token_ids.map((_, i) => (i < forced ? 0 : 1)));
    assert.deepEqual(turn.logprobs.slice(0, forced), new Array<number>(forced).fill(0));
    assert.ok(turn.logprobs.slice(forced).every((x) => x === -0.25));
    // The generate request's context ended with the forced tokens: the policy continued them.
    const req = scripted.requests.filter((r) => r.sessionId === c.rlstream.trajectory_id).at(-1)!;
    assert.deepEqual(req.promptIds.slice(-forced), c.rlstream.token_ids.slice(0, forced));
    // The call continues as any tool call does, and the trajectory's response_mask keeps the forced zeros.
    const callMsg = c.message.tool_calls![0]!;
    const next = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: [...ANSWER_PROMPT, { role: 'assistant', content: null, tool_calls: [callMsg] }, { role: 'tool', tool_call_id: callMsg.id, content: '5' }] });
    assert.equal(next.status, 200, next.text);
    assert.equal(choices(next)[0]!.rlstream.trajectory_id, c.rlstream.trajectory_id);
    assert.equal((await call(job, 'POST', `/v1/trajectories/${c.rlstream.trajectory_id}/complete`, {})).status, 200);
    events = await topicEvents(job, TOPICS.rolloutEvents);
    const done = events.filter((e) => e.name === 'TrajectoryCompleted').map((e) => (e.value as TrajectoryCompleted).trajectory).find((t) => t.trajectory_id === c.rlstream.trajectory_id)!;
    assert.deepEqual(done.response_mask.slice(0, c.rlstream.token_ids.length), turn.response_mask);
    assert.deepEqual(done.response_policy_versions.slice(0, forced), new Array<number>(forced).fill(-1));
    // The forced tokens are the ones the template writes for that text: re-rendering the conversation (the
    // tokenization check, on every observation here) finds no mismatch.
    const toolTurn = events.filter((e) => e.name === 'TurnCompleted').map((e) => e.value as TurnCompleted).find((t) => t.trajectory_id === c.rlstream.trajectory_id && t.role === 'tool')!;
    assert.equal(toolTurn.tokenization_mismatch, false);

    // Arguments that are not JSON: the model failed, said as OpenAI says it, and nothing pretends otherwise.
    const bad = [PROMPT[0], { role: 'user', content: 'BAD ARGS please' }];
    const sessions = job.service.openSessions;
    const failed = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: bad, tool_choice: 'required' });
    assert.equal(failed.status, 500, failed.text);
    const err = failed.json['error'] as { type: string; code: string; param: string; message: string };
    assert.deepEqual([err.type, err.code, err.param], ['model_error', 'SRV_ERR_MODEL_OUTPUT', 'tool_choice']);
    assert.match(err.message, /The model produced invalid content: .*failed to decode tool call/);
    assert.equal(job.service.openSessions, sessions);
    // Recorded as generated, ended as error: the reward consumer scores it like any other trajectory.
    events = await topicEvents(job, TOPICS.rolloutEvents);
    // (The log is partitioned by group: found by its termination, not by its place in the topic.)
    const errored = events.filter((e) => e.name === 'TrajectoryCompleted').map((e) => (e.value as TrajectoryCompleted).trajectory).filter((t) => t.termination === 'error');
    assert.equal(errored.length, 1);
    assert.match(errored[0]!.response_text, /expression=2\+3/);

    // A continued conversation whose forced turn fails ends its trajectory too (its client never got the turn).
    const first = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: bad });
    const fc = choices(first)[0]!;
    assert.equal(fc.finish_reason, 'tool_calls');
    const m = fc.message.tool_calls![0]!;
    const again = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: [...bad, { role: 'assistant', content: null, tool_calls: [m] }, { role: 'tool', tool_call_id: m.id, content: '5' }], tool_choice: named });
    assert.equal(again.status, 500, again.text);
    const after = await call(job, 'POST', '/v1/chat/completions', { ...BASE, messages: [...bad, { role: 'assistant', content: null, tool_calls: [m] }, { role: 'tool', tool_call_id: m.id, content: '5' }] }, { 'x-rlstream-trajectory': fc.rlstream.trajectory_id });
    assert.equal(after.status, 409, after.text);
    assert.match((after.json['error'] as { message: string }).message, /already completed \(error\)/);
  });

  it('a prompt beyond the limit is 400 naming the limit, before anything is generated', async () => {
    const generated = scripted.requests.length;
    const res = await call(job, 'POST', '/v1/chat/completions', { model: 'calculator', messages: [{ role: 'user', content: 'seven '.repeat(3000) }] });
    assert.equal(res.status, 400, res.text);
    const err = res.json['error'] as { code: string; message: string };
    assert.equal(err.code, 'SRV_ERR_PROMPT_TOO_LONG');
    assert.match(err.message, /at most \d+/);
    assert.equal(scripted.requests.length, generated);
  });

  it('at shutdown no TrajectoryCompleted is written without its TrajectoryStarted', async () => {
    await call(job, 'POST', '/v1/chat/completions', BASE);
    await job.service.close();
    const events = await topicEvents(job, TOPICS.rolloutEvents);
    const started = new Set(events.filter((e) => e.name === 'TrajectoryStarted').map((e) => (e.value as TrajectoryStarted).trajectory_id));
    const completed = events.filter((e) => e.name === 'TrajectoryCompleted').map((e) => (e.value as TrajectoryCompleted).trajectory.trajectory_id);
    assert.ok(completed.length > 10);
    for (const id of completed) assert.ok(started.has(id), `TrajectoryCompleted ${id} without TrajectoryStarted`);
    assert.equal(new Set(completed).size, completed.length);
  });
});
