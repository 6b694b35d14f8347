// The OpenAI wire shapes the endpoint accepts and answers (TypeBox: validated on the way in, documented in
// /openapi.json), and their conversion into the session's messages. The request schemas are allow-lists: every
// field of OpenAI's chat/completions and completions requests is listed with the values this endpoint honours
// (a field it cannot honour accepts only its neutral value, or is refused by name, see REFUSED_FIELDS); a field
// OpenAI does not have is refused by name too. Every number has a range the event contract can carry (int for
// token counts and top_k, ±(2^53 - 2) for seed, an Avro long as avsc writes it), so a call is refused before any trajectory opens.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import type { ChatMessage, ChatTool } from '../tokenizer/chat-tokenizer.ts';
import { ServeError } from './errors.ts';
import type { ClientMessage } from './session.ts';

/** Avro `int` (SamplingParams.max_new_tokens, top_k): the largest value an event can carry. */
export const INT32_MAX = 2 ** 31 - 1;
/** The largest seed an event carries: avsc writes an Avro long from a JS number only within ±(2^53 - 2). */
export const SEED_MAX = 2 ** 53 - 2;
/** Most alternatives per token (OpenAI's own limit). */
export const MAX_TOP_LOGPROBS = 20;
/** Most alternatives per token on completions (OpenAI's own limit there). */
export const MAX_COMPLETION_LOGPROBS = 5;
/** Most stop strings (OpenAI's own limit). */
export const MAX_STOP = 4;

const open = { additionalProperties: true } as const;
const closed = { additionalProperties: false } as const;
/** A value or null; the description goes on both, so a refusal of the value can say why. */
const nullable = <T extends TSchema>(t: T, description?: string) => Type.Optional(Type.Union([description ? ({ ...t, description } as T) : t, Type.Null()], description ? { description } : {}));

/**
 * Fields of OpenAI's requests this endpoint refuses whatever their value, with why (the 400 names the field and
 * says this). Fields whose neutral value is accepted (frequency_penalty 0, …) are in the schemas instead.
 */
export const REFUSED_FIELDS: Readonly<Record<string, string>> = {
  audio: 'audio output is not supported (text only)',
  prediction: 'predicted outputs are not supported',
  web_search_options: 'web search is not supported',
  functions: 'the deprecated functions field is not supported; declare them in tools',
  function_call: 'the deprecated function_call field is not supported; use tool_choice',
};

/** OpenAI's other content parts (images, audio, files, refusals in assistant content): refused by name. */
const ContentPart = Type.Object({ type: Type.String(), text: Type.Optional(Type.String()) }, open);

const ToolCallWire = Type.Object(
  {
    id: Type.String({ minLength: 1, maxLength: 200 }),
    type: Type.Optional(Type.Literal('function')),
    function: Type.Object({ name: Type.String({ minLength: 1, maxLength: 200 }), arguments: Type.String() }, closed),
  },
  closed,
);

const MessageWire = Type.Object(
  {
    role: Type.Union([Type.Literal('system'), Type.Literal('developer'), Type.Literal('user'), Type.Literal('assistant'), Type.Literal('tool')]),
    content: Type.Optional(Type.Union([Type.String(), Type.Null(), Type.Array(ContentPart, { maxItems: 4096 })])),
    tool_calls: Type.Optional(Type.Union([Type.Array(ToolCallWire, { maxItems: 128 }), Type.Null()])),
    tool_call_id: Type.Optional(Type.Union([Type.String({ maxLength: 200 }), Type.Null()])),
    name: Type.Optional(Type.Union([Type.String({ maxLength: 200 }), Type.Null()], { description: 'A participant name (templates do not render it).' })),
    refusal: Type.Optional(Type.Null({ description: 'An assistant message as returned here (never a refusal).' })),
  },
  closed,
);

const ToolWire = Type.Object(
  {
    type: Type.Literal('function'),
    function: Type.Object(
      {
        name: Type.String({ minLength: 1, maxLength: 200, pattern: '^[A-Za-z0-9_.:-]+$' }),
        description: Type.Optional(Type.String()),
        parameters: Type.Optional(Type.Object({}, open)),
        strict: nullable(Type.Boolean(), 'Accepted; the arguments are what the policy generated (never constrained to the schema): a policy in training is what learns to follow it.'),
      },
      closed,
    ),
  },
  closed,
);

const NamedToolChoice = Type.Object({ type: Type.Literal('function'), function: Type.Object({ name: Type.String({ minLength: 1, maxLength: 200 }) }, closed) }, closed);

const StreamOptions = Type.Object(
  {
    include_usage: nullable(Type.Boolean(), 'A last chunk with the usage and no choices.'),
    include_obfuscation: nullable(Type.Literal(false), 'Only false: chunks are not padded.'),
  },
  closed,
);

const Stop = nullable(Type.Union([Type.String({ minLength: 1, maxLength: 256 }), Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { maxItems: MAX_STOP })]), `Up to ${MAX_STOP} strings; the text returned ends before the first one generated (the recorded tokens end with the token completing it).`);

/** Sampling fields shared by both completion routes. */
const samplingFields = {
  model: Type.String({ maxLength: 256, description: 'The served model id (GET /v1/models).' }),
  temperature: nullable(Type.Number({ minimum: 0, maximum: 2 })),
  top_p: nullable(Type.Number({ exclusiveMinimum: 0, maximum: 1 })),
  top_k: nullable(Type.Integer({ minimum: 0, maximum: INT32_MAX }), 'Extension: top-k sampling (0: off).'),
  max_tokens: nullable(Type.Integer({ minimum: 1, maximum: INT32_MAX })),
  seed: nullable(Type.Integer({ minimum: -SEED_MAX, maximum: SEED_MAX })),
  n: nullable(Type.Integer({ minimum: 1, maximum: 64 }), 'Samples of this prompt: on a new conversation, one trajectory each, together one group (group_size n).'),
  stream: nullable(Type.Boolean()),
  stream_options: nullable(StreamOptions),
  stop: Stop,
  frequency_penalty: nullable(Type.Literal(0), 'Only 0: the policy samples as in training.'),
  presence_penalty: nullable(Type.Literal(0), 'Only 0: the policy samples as in training.'),
  logit_bias: nullable(Type.Object({}, { additionalProperties: false, description: 'Only {}: the policy samples as in training.' })),
  user: Type.Optional(Type.String({ maxLength: 256 })),
  metadata: nullable(
    Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 4096 }), {
      maxProperties: 16,
      description: 'rlstream reads trajectory_id, group_id, group_size, sample_index, data_source, ground_truth, agent_name (all strings, as OpenAI metadata values are).',
    }),
  ),
  store: nullable(Type.Literal(true), 'Only true (or absent): every call is recorded for training.'),
  service_tier: nullable(Type.Union([Type.Literal('auto'), Type.Literal('default')])),
  prompt_cache_key: Type.Optional(Type.String({ maxLength: 1024, description: 'Accepted; the KV cache is kept per trajectory.' })),
  safety_identifier: Type.Optional(Type.String({ maxLength: 256 })),
};

export const ChatCompletionRequest = Type.Object(
  {
    ...samplingFields,
    messages: Type.Array(MessageWire, { minItems: 1, maxItems: 4096 }),
    max_completion_tokens: nullable(Type.Integer({ minimum: 1, maximum: INT32_MAX })),
    tools: nullable(Type.Array(ToolWire, { maxItems: 128 })),
    tool_choice: nullable(
      Type.Union([Type.Literal('auto'), Type.Literal('none'), Type.Literal('required'), NamedToolChoice]),
      "auto: the policy decides; none: no tool call is parsed out of the turn (its text is the content); required / a named function: the turn opens with the tool-call format's fixed prefix (the function's name included when it is named or the only tool), as tokens the policy did not sample (response_mask 0), and the policy writes the arguments; a turn that is then not a valid call answers 500 model_error.",
    ),
    parallel_tool_calls: nullable(Type.Boolean(), 'false: at most one call per turn is returned.'),
    logprobs: nullable(Type.Boolean()),
    top_logprobs: nullable(Type.Integer({ minimum: 0, maximum: MAX_TOP_LOGPROBS }), 'Alternatives per token (needs logprobs: true): the most probable tokens of the distribution each token was sampled from.'),
    response_format: nullable(Type.Object({ type: Type.Literal('text') }, closed), "Only {type: 'text'}: the output is never constrained to a schema."),
    modalities: nullable(Type.Array(Type.Literal('text'), { minItems: 1, maxItems: 1 }), "Only ['text']."),
    reasoning_effort: Type.Optional(Type.Null({ description: 'Not supported (only null): the policy has no reasoning budget.' })),
    verbosity: Type.Optional(Type.Null({ description: 'Not supported (only null).' })),
  },
  closed,
);
export type ChatCompletionRequest = Static<typeof ChatCompletionRequest>;

/** A prompt of token ids: in OpenAI's reference, refused here by name (text only). */
const TokenPrompt = Type.Array(Type.Integer({ minimum: 0, maximum: INT32_MAX }), { minItems: 1, maxItems: 1_000_000 });

export const CompletionRequest = Type.Object(
  {
    ...samplingFields,
    prompt: Type.Union([Type.String(), Type.Array(Type.String(), { minItems: 1, maxItems: 64 }), TokenPrompt, Type.Array(TokenPrompt, { minItems: 1, maxItems: 64 })], {
      description: 'A text (tokenized without a chat template) or a list of texts: each prompt opens its own group of n samples; choice index = prompt index × n + sample. Token-id prompts are refused (send text).',
    }),
    logprobs: nullable(Type.Integer({ minimum: 0, maximum: MAX_COMPLETION_LOGPROBS }), 'Log-probs of the sampled tokens, and this many alternatives each (the most probable tokens of the distribution each was sampled from).'),
    echo: nullable(Type.Literal(false), 'Only false: the prompt is not returned.'),
    best_of: nullable(Type.Literal(1), 'Only 1: ask for n samples (one group) and rank them yourself.'),
    suffix: Type.Optional(Type.Null({ description: 'Not supported (only null): no insertion.' })),
  },
  closed,
);
export type CompletionRequest = Static<typeof CompletionRequest>;

export const CompleteRequest = Type.Object(
  {
    reward: Type.Optional(Type.Union([Type.Number(), Type.Null()], { description: 'The outcome reward; absent or null lets the reward consumer score the trajectory from its data_source and ground_truth.' })),
    ground_truth: Type.Optional(Type.String({ maxLength: 65536, description: 'Ground truth for the task reward (replaces the one given at the start).' })),
    termination: Type.Optional(Type.Union([Type.Literal('stop'), Type.Literal('max_turns'), Type.Literal('max_tokens'), Type.Literal('error'), Type.Literal('aborted')], { default: 'stop' })),
  },
  { additionalProperties: false },
);
export type CompleteRequest = Static<typeof CompleteRequest>;

export const CompleteResponse = Type.Object({
  trajectory_id: Type.String(),
  group_id: Type.String(),
  termination: Type.String(),
  num_turns: Type.Integer(),
  response_tokens: Type.Integer(),
  tokenization_mismatches: Type.Integer(),
});

export const ModelObject = Type.Object({ id: Type.String(), object: Type.Literal('model'), created: Type.Integer(), owned_by: Type.String() });

export const ModelList = Type.Object({ object: Type.Literal('list'), data: Type.Array(ModelObject) });

const ChoiceExtension = Type.Object(
  {
    trajectory_id: Type.String(),
    group_id: Type.String(),
    turn_index: Type.Integer({ description: 'Index of this turn in the trajectory (-1 when nothing was generated).' }),
    token_ids: Type.Array(Type.Integer(), { description: 'The generated token ids, as recorded.' }),
    forced_tokens: Type.Integer({ description: 'How many leading token_ids the endpoint forced (tool_choice required or a named function): not sampled, response_mask 0, no log-prob.' }),
    policy_version: Type.Integer(),
    completed: Type.Union([Type.String(), Type.Null()], { description: 'The termination when this call ended the trajectory (its response budget is spent).' }),
  },
  { description: 'rlstream extension: what this choice recorded.' },
);

export const ChatCompletionResponse = Type.Object(
  {
    id: Type.String(),
    object: Type.Literal('chat.completion'),
    created: Type.Integer(),
    model: Type.String(),
    choices: Type.Array(Type.Object({ index: Type.Integer(), message: Type.Object({}, open), logprobs: Type.Union([Type.Object({}, open), Type.Null()]), finish_reason: Type.String(), rlstream: ChoiceExtension }, open)),
    usage: Type.Object({ prompt_tokens: Type.Integer(), completion_tokens: Type.Integer(), total_tokens: Type.Integer() }),
  },
  open,
);

export const CompletionResponse = Type.Object(
  {
    id: Type.String(),
    object: Type.Literal('text_completion'),
    created: Type.Integer(),
    model: Type.String(),
    choices: Type.Array(Type.Object({ index: Type.Integer(), text: Type.String(), logprobs: Type.Union([Type.Object({}, open), Type.Null()]), finish_reason: Type.String(), rlstream: ChoiceExtension }, open)),
    usage: Type.Object({ prompt_tokens: Type.Integer(), completion_tokens: Type.Integer(), total_tokens: Type.Integer() }),
  },
  open,
);

export const ErrorResponse = Type.Object({ error: Type.Object({ message: Type.String(), type: Type.String(), code: Type.String(), param: Type.Union([Type.String(), Type.Null()], { description: 'The request field the error is about.' }) }) });

type MessageWire = Static<typeof MessageWire>;

/** Content as one text: null, absent, a string and a list of text parts are the same message when their text is. */
function contentText(content: MessageWire['content'], where: string): string {
  if (content === undefined || content === null) return '';
  if (typeof content === 'string') return content;
  return content
    .map((p, i) => {
      if (p.type !== 'text' || typeof p.text !== 'string') {
        throw new ServeError('SRV_ERR_VALIDATION', { detail: `${where}.content[${i}].type: only text parts are supported, got ${JSON.stringify(p.type)}` }, { param: `${where}.content[${i}].type` });
      }
      return p.text;
    })
    .join('');
}

/** The client's view of a message (identity checks) and the message as chat templates read it. */
export function clientMessage(m: MessageWire, i: number): ClientMessage {
  const where = `messages[${i}]`;
  const role = m.role === 'developer' ? 'system' : m.role;
  if (role === 'tool' && (m.tool_call_id === undefined || m.tool_call_id === null)) throw new ServeError('SRV_ERR_VALIDATION', { detail: `${where}.tool_call_id: a tool message needs one` }, { param: `${where}.tool_call_id` });
  if (role !== 'assistant' && (m.tool_calls ?? []).length > 0) throw new ServeError('SRV_ERR_VALIDATION', { detail: `${where}.tool_calls: only an assistant message has tool calls` }, { param: `${where}.tool_calls` });
  return {
    role,
    content: contentText(m.content, where),
    tool_calls: (m.tool_calls ?? []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments })),
    tool_call_id: m.tool_call_id ?? null,
  };
}

/** A prompt message (not generated here) as the chat template reads it. */
export function templateMessage(m: ClientMessage, toolNames: ReadonlyMap<string, string>): ChatMessage {
  const out: ChatMessage = { role: m.role, content: m.content };
  if (m.tool_calls.length > 0) out.tool_calls = m.tool_calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
  if (m.tool_call_id !== null) {
    out.tool_call_id = m.tool_call_id;
    const name = toolNames.get(m.tool_call_id);
    if (name !== undefined) out.name = name;
  }
  return out;
}

/**
 * The tools as templates read them, each with the keys OpenAI lets a client leave out given their meaning
 * (description '', parameters an object schema with no properties, required [] when an object schema names
 * none): a template may read any of them (the calculator's joins `parameters.required`).
 */
export function chatTools(tools: ChatCompletionRequest['tools']): ChatTool[] {
  const list = (tools ?? []).map((t): ChatTool => {
    const params: Record<string, unknown> = { ...(t.function.parameters ?? { type: 'object', properties: {} }) };
    if (params['type'] === 'object') {
      params['properties'] ??= {};
      params['required'] ??= [];
    }
    return { type: 'function', function: { name: t.function.name, description: t.function.description ?? '', parameters: params } };
  });
  const seen = new Set<string>();
  for (const [i, t] of list.entries()) {
    if (seen.has(t.function.name)) throw new ServeError('SRV_ERR_VALIDATION', { detail: `tools[${i}].function.name: tool ${t.function.name} is declared twice` }, { param: `tools[${i}].function.name` });
    seen.add(t.function.name);
  }
  return list;
}

/** The assistant message of a served turn in OpenAI's shape. */
export function assistantWire(m: ClientMessage): Record<string, unknown> {
  const out: Record<string, unknown> = { role: 'assistant', content: m.content === '' && m.tool_calls.length > 0 ? null : m.content };
  if (m.tool_calls.length > 0) out['tool_calls'] = m.tool_calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
  return out;
}
