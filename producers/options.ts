// Rollout options (the `rollout:` section of a config file, snake_case as written there), each with its
// documented default, compiled once into a frozen, fully specified object. Errors name the field.
import { Type } from '@sinclair/typebox';
import { RlstreamError } from '../core/errors.ts';
import { DEFAULT_STALENESS_BOUND } from '../core/staleness.ts';
import { intOrNull, numberOrNull, oneOf, stringOrNull } from '../core/config/validate.ts';
import type { SamplingParams } from '../schemas/generated/types.ts';
import type { TokenizationCheckMode } from './tokenizer/delta.ts';

export interface RolloutOptions {
  /** Samples per dataset row (the group size). Default 1. */
  n?: number;
  /** Agent loops running at once. Default 64. */
  concurrency?: number;
  /** In-flight budget: no new group starts while this many trajectories are unfinished. Default (or null) 2 × concurrency. */
  max_inflight_trajectories?: number | null;
  /** Groups the trainer takes per step (for the staleness gate). Default 1. */
  groups_per_step?: number;
  /** Policy versions a sample may lag (AReaL's max off-policyness); null turns the gate off. Default: the run's (core/staleness.ts). */
  staleness_bound?: number | null;
  /** Generated turns per trajectory. Default 8. */
  max_assistant_turns?: number;
  /** Tool-response and user turns per trajectory. Default 8. */
  max_user_turns?: number;
  /** Response tokens per trajectory (all turns). Default 1024. */
  response_length?: number;
  /** Tool calls executed per assistant turn. Default 8. */
  max_parallel_tool_calls?: number;
  /** Failed tool calls before a trajectory stops with tool_error_limit. Default 4. */
  max_tool_errors?: number;
  /** Delta vs full re-tokenization check. Default 'ignore_strippable'. */
  tokenization_check?: TokenizationCheckMode;
  /**
   * Run the tokenization check on every N-th trajectory the worker starts (all of its tool / user turns;
   * the others skip it: a full re-render and re-encode of the conversation per turn is the worker's
   * largest cost). 1 checks every trajectory. Default 8.
   */
  tokenization_check_every?: number;
  /** Tool-call parser by name. Default 'hermes'. */
  tool_parser?: string | null;
  /** Loop for rows without agent_name. Default 'single_turn'. */
  default_agent?: string;
  /** Sampling; max_new_tokens (undefined or null) defaults to response_length. Defaults: temperature 1, top_p 1, top_k 0 (off), no seed. */
  /** null temperature, top_p or top_k: the default (1, 1, 0; a run fills them from the model directory first). */
  sampling?: Partial<Omit<SamplingParams, 'max_new_tokens' | 'temperature' | 'top_p' | 'top_k'>> & { max_new_tokens?: number | null; temperature?: number | null; top_p?: number | null; top_k?: number | null };
  /** Passes over a finite dataset; null repeats forever. Default 1. */
  epochs?: number | null;
  /** Name recorded in DatasetRef. Default 'dataset'. */
  dataset_name?: string;
  /** Split recorded for training rows when a row has none. Default 'train'. */
  split?: string;
  /** Extra chat-template variables (e.g. enable_thinking: false). Default {}. */
  template_kwargs?: Record<string, unknown>;
  /** Wait per poll of policy.versions / control. Default 200 ms. */
  poll_interval_ms?: number;
}

export interface CompiledRolloutOptions {
  readonly n: number;
  readonly concurrency: number;
  readonly maxInflightTrajectories: number;
  readonly groupsPerStep: number;
  readonly stalenessBound: number | null;
  readonly maxAssistantTurns: number;
  readonly maxUserTurns: number;
  readonly responseLength: number;
  readonly maxParallelToolCalls: number;
  readonly maxToolErrors: number;
  readonly tokenizationCheck: TokenizationCheckMode;
  readonly tokenizationCheckEvery: number;
  readonly toolParser: string;
  readonly defaultAgent: string;
  readonly sampling: Readonly<SamplingParams>;
  readonly epochs: number | null;
  readonly datasetName: string;
  readonly split: string;
  readonly templateKwargs: Readonly<Record<string, unknown>>;
  readonly pollIntervalMs: number;
}

function fail(field: string, what: string): never {
  throw new RlstreamError('CONFIG_INVALID', `rollout.${field} ${what}`);
}

function posInt(o: Record<string, unknown>, field: string, dflt: number): number {
  const v = o[field];
  if (v === undefined) return dflt;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) fail(field, 'must be a positive integer');
  return v;
}

function num(o: Record<string, unknown>, field: string, dflt: number, check: (x: number) => boolean, what: string): number {
  const v = o[field];
  if (v === undefined) return dflt;
  if (typeof v !== 'number' || !Number.isFinite(v) || !check(v)) fail(field, what);
  return v;
}

const KNOWN = new Set([
  'n', 'concurrency', 'max_inflight_trajectories', 'groups_per_step', 'staleness_bound', 'max_assistant_turns', 'max_user_turns',
  'response_length', 'max_parallel_tool_calls', 'max_tool_errors', 'tokenization_check', 'tokenization_check_every', 'tool_parser', 'default_agent', 'sampling',
  'epochs', 'dataset_name', 'split', 'template_kwargs', 'poll_interval_ms',
]);

export function compileRolloutOptions(options: RolloutOptions = {}): CompiledRolloutOptions {
  if (options === null || typeof options !== 'object') throw new RlstreamError('CONFIG_INVALID', 'rollout must be a mapping');
  const o: Record<string, unknown> = { ...options };
  // null means "the default" for the budgets derived from other fields (as the config schema writes them).
  if (o['max_inflight_trajectories'] === null) delete o['max_inflight_trajectories'];
  for (const k of Object.keys(o)) if (!KNOWN.has(k)) fail(k, `is not a rollout option (known: ${[...KNOWN].join(', ')})`);
  const concurrency = posInt(o, 'concurrency', 64);
  const responseLength = posInt(o, 'response_length', 1024);
  let stalenessBound: number | null = DEFAULT_STALENESS_BOUND;
  if (o['staleness_bound'] === null) stalenessBound = null;
  else if (o['staleness_bound'] !== undefined) {
    const v = o['staleness_bound'];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) fail('staleness_bound', 'must be a non-negative integer or null');
    stalenessBound = v;
  }
  const check = o['tokenization_check'] ?? 'ignore_strippable';
  if (check !== 'strict' && check !== 'ignore_strippable' && check !== 'off') fail('tokenization_check', 'must be strict, ignore_strippable or off');
  let epochs: number | null = 1;
  if (o['epochs'] === null) epochs = null;
  else epochs = posInt(o, 'epochs', 1);
  const str = (field: string, dflt: string): string => {
    const v = o[field];
    if (v === undefined) return dflt;
    if (typeof v !== 'string' || v === '') fail(field, 'must be a non-empty string');
    return v;
  };
  const s: Record<string, unknown> = { ...((o['sampling'] ?? {}) as Record<string, unknown>) };
  if (typeof o['sampling'] !== 'undefined' && (typeof o['sampling'] !== 'object' || o['sampling'] === null || Array.isArray(o['sampling']))) fail('sampling', 'must be a mapping');
  for (const k of ['max_new_tokens', 'temperature', 'top_p', 'top_k']) if (s[k] === null) delete s[k];
  const sf = (field: string, dflt: number, ok: (x: number) => boolean, what: string) => {
    try {
      return num(s, field, dflt, ok, what);
    } catch {
      fail(`sampling.${field}`, what);
    }
  };
  const seed = s['seed'];
  if (seed !== undefined && seed !== null && (typeof seed !== 'number' || !Number.isInteger(seed))) fail('sampling.seed', 'must be an integer or null');
  const stops = s['stop_token_ids'] ?? [];
  if (!Array.isArray(stops) || stops.some((x) => typeof x !== 'number' || !Number.isInteger(x) || x < 0)) fail('sampling.stop_token_ids', 'must be a list of token ids');
  const sampling: SamplingParams = {
    temperature: sf('temperature', 1, (x) => x >= 0, 'must be a number >= 0'),
    top_p: sf('top_p', 1, (x) => x > 0 && x <= 1, 'must be in (0, 1]'),
    top_k: sf('top_k', 0, (x) => Number.isInteger(x) && x >= 0, 'must be a non-negative integer (0 = off)'),
    max_new_tokens: sf('max_new_tokens', responseLength, (x) => Number.isInteger(x) && x >= 1, 'must be a positive integer'),
    seed: (seed as number | null | undefined) ?? null,
    stop_token_ids: stops as number[],
  };
  const tk = o['template_kwargs'] ?? {};
  if (typeof tk !== 'object' || tk === null || Array.isArray(tk)) fail('template_kwargs', 'must be a mapping');
  return Object.freeze({
    n: posInt(o, 'n', 1),
    concurrency,
    maxInflightTrajectories: posInt(o, 'max_inflight_trajectories', 2 * concurrency),
    groupsPerStep: posInt(o, 'groups_per_step', 1),
    stalenessBound,
    maxAssistantTurns: posInt(o, 'max_assistant_turns', 8),
    maxUserTurns: posInt(o, 'max_user_turns', 8),
    responseLength,
    maxParallelToolCalls: posInt(o, 'max_parallel_tool_calls', 8),
    maxToolErrors: posInt(o, 'max_tool_errors', 4),
    tokenizationCheck: check,
    tokenizationCheckEvery: posInt(o, 'tokenization_check_every', 8),
    toolParser: o['tool_parser'] === null ? 'hermes' : str('tool_parser', 'hermes'),
    defaultAgent: str('default_agent', 'single_turn'),
    sampling: Object.freeze(sampling),
    epochs,
    datasetName: str('dataset_name', 'dataset'),
    split: str('split', 'train'),
    templateKwargs: Object.freeze({ ...(tk as Record<string, unknown>) }),
    pollIntervalMs: posInt(o, 'poll_interval_ms', 200),
  });
}

/**
 * The `rollout:` section of a run config, with the defaults of compileRolloutOptions (a test holds them
 * equal). groups_per_step and staleness_bound are not here: the run sets them from trainer.* so both ends of
 * the staleness gate use one value; dataset_name comes from the task.
 */
export const RolloutSection = Type.Object(
  {
    n: Type.Integer({ minimum: 1, default: 1, description: 'Samples per dataset row (the group size).' }),
    concurrency: Type.Integer({ minimum: 1, default: 64, description: 'Agent loops running at once.' }),
    max_inflight_trajectories: intOrNull({ minimum: 1, default: null, description: 'No new group starts while this many trajectories are unfinished (default 2 × concurrency).' }),
    max_assistant_turns: Type.Integer({ minimum: 1, default: 8, description: 'Generated turns per trajectory.' }),
    max_user_turns: Type.Integer({ minimum: 1, default: 8, description: 'Tool-response and user turns per trajectory.' }),
    response_length: Type.Integer({ minimum: 1, default: 1024, description: 'Response tokens per trajectory (all turns).' }),
    max_parallel_tool_calls: Type.Integer({ minimum: 1, default: 8, description: 'Tool calls executed per assistant turn.' }),
    max_tool_errors: Type.Integer({ minimum: 1, default: 4, description: 'Failed tool calls before a trajectory stops with tool_error_limit.' }),
    tokenization_check: oneOf(['ignore_strippable', 'strict', 'off'] as const, { default: 'ignore_strippable', description: 'Delta vs full re-tokenization check of tool and user turns.' }),
    tokenization_check_every: Type.Integer({ minimum: 1, default: 8, description: 'Run the tokenization check on every N-th trajectory (1: all).' }),
    tool_parser: stringOrNull({ default: null, description: "Tool-call parser by name: hermes (Qwen2.5, Qwen3), llama3_json (Llama 3.1+), mistral; null: the model family's (model.config's model_type), hermes without one." }),
    default_agent: Type.String({ minLength: 1, default: 'single_turn', description: 'Agent loop for rows without agent_name (single_turn, tool_agent, or one of agent_loops).' }),
    agent_loops: Type.Record(
      Type.String(),
      Type.Object({ module: Type.String({ minLength: 1 }), export: Type.Optional(Type.String({ minLength: 1 })) }, { additionalProperties: false }),
      { default: {}, description: 'Agent loops of your own by name: { module: ./loop.ts, export: name } (an AgentLoop object or a class).' },
    ),
    interactions: Type.Record(
      Type.String(),
      Type.Object({ module: Type.String({ minLength: 1 }), export: Type.Optional(Type.String({ minLength: 1 })) }, { additionalProperties: false }),
      { default: {}, description: 'Interactions (user simulators) of your own by name, as rows name them in extra_info.interaction_kwargs.name: { module: ./user.ts, export: name }. Built-in: gsm8k.' },
    ),
    sampling: Type.Object(
      {
        temperature: numberOrNull({ minimum: 0, default: null, description: "Sampling temperature (0: greedy; null: the model directory's generation_config.json, else 1)." }),
        top_p: numberOrNull({ exclusiveMinimum: 0, maximum: 1, default: null, description: "Nucleus sampling mass (null: the model directory's generation_config.json, else 1)." }),
        top_k: intOrNull({ minimum: 0, default: null, description: "Top-k (0: off; null: generation_config.json's, else 0)." }),
        max_new_tokens: intOrNull({ minimum: 1, default: null, description: 'Tokens per generate call (default: response_length).' }),
        seed: intOrNull({ default: null, description: 'Sampling seed (null: none).' }),
        stop_token_ids: Type.Optional(Type.Array(Type.Integer({ minimum: 0 }), { description: "Stop tokens (default: the tokenizer's end-of-sequence token)." })),
      },
      { additionalProperties: false, default: {}, description: 'Sampling parameters.' },
    ),
    interrupt: oneOf(['next_turn', 'finish', 'next_token'] as const, {
      default: 'next_turn',
      description:
        "How a new policy version reaches trajectories under way: at their next turn ('next_turn'), only for trajectories started after it ('finish'), or at the next token ('next_token': the turn in flight goes on with the new weights, each token keeping the version that sampled it and its log-prob; the staleness bound counts the oldest token). The backend must support it (builtin: all three; server backends: next_turn).",
    }),
    epochs: intOrNull({ minimum: 1, default: 1, description: 'Passes over a finite dataset; null repeats forever.' }),
    split: Type.String({ minLength: 1, default: 'train', description: 'Split recorded for training rows that carry none.' }),
    template_kwargs: Type.Record(Type.String(), Type.Unknown(), { default: {}, description: 'Extra chat-template variables (e.g. enable_thinking: false).' }),
    poll_interval_ms: Type.Integer({ minimum: 1, default: 200, description: 'Wait per poll of policy.versions / control.' }),
  },
  { additionalProperties: false, default: {}, description: 'The rollout workers (agent loops, sampling, limits).' },
);
