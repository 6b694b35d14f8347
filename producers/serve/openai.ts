// The OpenAI wire shapes the endpoint accepts and answers (TypeBox: validated on the way in, documented in
// /openapi.json), and their conversion into the session's messages. Fields the OpenAI API has and this endpoint
// ignores are allowed (SDKs send them); fields whose meaning it cannot honour are refused with a 400.
import { Type, type Static } from '@sinclair/typebox';
import type { ChatMessage, ChatTool } from '../tokenizer/chat-tokenizer.ts';
import { ServeError } from './errors.ts';
import type { ClientMessage } from './session.ts';

const open = { additionalProperties: true } as const;

const ContentPart = Type.Object({ type: Type.String(), text: Type.Optional(Type.String()) }, open);

const ToolCallWire = Type.Object(
  {
    id: Type.String({ maxLength: 200 }),
    type: Type.Optional(Type.Literal('function')),
    function: Type.Object({ name: Type.String({ maxLength: 200 }), arguments: Type.String() }, open),
  },
  open,
);

const MessageWire = Type.Object(
  {
    role: Type.Union([Type.Literal('system'), Type.Literal('developer'), Type.Literal('user'), Type.Literal('assistant'), Type.Literal('tool')]),
    content: Type.Optional(Type.Union([Type.String(), Type.Null(), Type.Array(ContentPart)])),
    tool_calls: Type.Optional(Type.Union([Type.Array(ToolCallWire), Type.Null()])),
    tool_call_id: Type.Optional(Type.Union([Type.String({ maxLength: 200 }), Type.Null()])),
    name: Type.Optional(Type.Union([Type.String(), Type.Null()])),
  },
  open,
);

const ToolWire = Type.Object(
  {
    type: Type.Literal('function'),
    function: Type.Object(
      {
        name: Type.String({ minLength: 1, maxLength: 200 }),
        description: Type.Optional(Type.String()),
        parameters: Type.Optional(Type.Object({}, open)),
      },
      open,
    ),
  },
  open,
);

/** Sampling fields shared by both completion routes. */
const samplingFields = {
  model: Type.String({ description: 'The served model id (GET /v1/models).' }),
  temperature: Type.Optional(Type.Union([Type.Number({ minimum: 0, maximum: 2 }), Type.Null()])),
  top_p: Type.Optional(Type.Union([Type.Number({ exclusiveMinimum: 0, maximum: 1 }), Type.Null()])),
  top_k: Type.Optional(Type.Union([Type.Integer({ minimum: 0 }), Type.Null()], { description: 'Extension: top-k sampling (0: off).' })),
  max_tokens: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
  max_completion_tokens: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
  seed: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
  n: Type.Optional(Type.Union([Type.Integer({ minimum: 1, maximum: 64 }), Type.Null()], { description: 'Samples of this prompt: on a new conversation, one trajectory each, together one group (group_size n).' })),
  stream: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  stop: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String()), Type.Null()], { description: 'Not supported (a turn ends at the model\'s end-of-turn token); only empty values are accepted.' })),
  user: Type.Optional(Type.String({ maxLength: 200 })),
  metadata: Type.Optional(
    Type.Union([
      Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 4096 }), {
        maxProperties: 16,
        description: 'rlstream reads trajectory_id, group_id, group_size, sample_index, data_source, ground_truth, agent_name (all strings, as OpenAI metadata values are).',
      }),
      Type.Null(),
    ]),
  ),
};

export const ChatCompletionRequest = Type.Object(
  {
    ...samplingFields,
    messages: Type.Array(MessageWire, { minItems: 1, maxItems: 4096 }),
    tools: Type.Optional(Type.Union([Type.Array(ToolWire, { maxItems: 128 }), Type.Null()])),
    tool_choice: Type.Optional(Type.Unknown({ description: "Only 'auto' (or absent) is honoured: the model decides." })),
    logprobs: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  },
  open,
);
export type ChatCompletionRequest = Static<typeof ChatCompletionRequest>;

export const CompletionRequest = Type.Object(
  {
    ...samplingFields,
    prompt: Type.Union([Type.String(), Type.Array(Type.String(), { minItems: 1, maxItems: 1 })], { description: 'One prompt (text, tokenized without a chat template).' }),
    logprobs: Type.Optional(Type.Union([Type.Integer({ minimum: 0, maximum: 0 }), Type.Null()], { description: 'Log-probs of the sampled tokens (0; alternatives are not computed).' })),
    echo: Type.Optional(Type.Union([Type.Literal(false), Type.Null()])),
  },
  open,
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

export const ModelList = Type.Object({
  object: Type.Literal('list'),
  data: Type.Array(Type.Object({ id: Type.String(), object: Type.Literal('model'), created: Type.Integer(), owned_by: Type.String() })),
});

const ChoiceExtension = Type.Object(
  {
    trajectory_id: Type.String(),
    group_id: Type.String(),
    turn_index: Type.Integer({ description: 'Index of this turn in the trajectory (-1 when nothing was generated).' }),
    token_ids: Type.Array(Type.Integer(), { description: 'The generated token ids, as recorded.' }),
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

export const ErrorResponse = Type.Object({ error: Type.Object({ message: Type.String(), type: Type.String(), code: Type.String(), param: Type.Null() }) });

type MessageWire = Static<typeof MessageWire>;

function contentText(content: MessageWire['content'], where: string): string {
  if (content === undefined || content === null) return '';
  if (typeof content === 'string') return content;
  return content
    .map((p, i) => {
      if (p.type !== 'text' || typeof p.text !== 'string') throw new ServeError('SRV_ERR_VALIDATION', { detail: `${where}.content[${i}]: only text parts are supported, got ${JSON.stringify(p.type)}` });
      return p.text;
    })
    .join('');
}

/** The client's view of a message (identity checks) and the message as chat templates read it. */
export function clientMessage(m: MessageWire, i: number): ClientMessage {
  const where = `messages[${i}]`;
  const role = m.role === 'developer' ? 'system' : m.role;
  if (role === 'tool' && (m.tool_call_id === undefined || m.tool_call_id === null)) throw new ServeError('SRV_ERR_VALIDATION', { detail: `${where}: a tool message needs tool_call_id` });
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

export function chatTools(tools: ChatCompletionRequest['tools']): ChatTool[] {
  const list = (tools ?? []).map((t) => ({ type: 'function' as const, function: { name: t.function.name, ...(t.function.description !== undefined ? { description: t.function.description } : {}), parameters: t.function.parameters ?? { type: 'object', properties: {} } } }));
  const seen = new Set<string>();
  for (const t of list) {
    if (seen.has(t.function.name)) throw new ServeError('SRV_ERR_VALIDATION', { detail: `tool ${t.function.name} is declared twice` });
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
