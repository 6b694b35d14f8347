// Rollout options: the `rollout:` section's schema (its keys, ranges, defaults and meaning, each default here
// and nowhere else), compiled once into a frozen camelCase RolloutConfig (the run config's `rollout`), and the
// worker's fully specified RolloutOptions: that config completed with what the run knows beside it (the
// trainer's staleness gate, the task's dataset name, the model directory's sampling defaults and tool-call format).
import { Type } from '@sinclair/typebox';
import { compileValue, intOrNull, numberOrNull, oneOf } from '../core/config/validate.ts';
import type { UserCodeRef } from '../core/config/registry.ts';
import type { SamplingParams } from '../schemas/generated/types.ts';
import { RlstreamError } from '../core/errors.ts';
import { toolParser, toolParserNames } from './agent/tool-parser.ts';
import type { RolloutInterrupt } from './policy/native-engine.ts';
import type { TokenizationCheckMode } from './tokenizer/delta.ts';

/** The sampling a value left null in the section and absent from the model directory gets: no temperature scaling, no nucleus or top-k cut. */
export const SAMPLING_FALLBACK = Object.freeze({ temperature: 1, top_p: 1, top_k: 0 });

/** The `rollout:` section compiled: every key camelCase and set, except where null means "the model's" (see RolloutRun). */
export interface RolloutConfig {
  /** Samples per dataset row (the group size). */
  readonly n: number;
  /** Agent loops running at once. */
  readonly concurrency: number;
  /** No new group starts while this many trajectories are unfinished (null in the section: 2 × concurrency). */
  readonly maxInflightTrajectories: number;
  readonly maxAssistantTurns: number;
  readonly maxUserTurns: number;
  /** Response tokens per trajectory (all turns). */
  readonly responseLength: number;
  readonly maxParallelToolCalls: number;
  readonly maxToolErrors: number;
  readonly tokenizationCheck: TokenizationCheckMode;
  /** Check every N-th trajectory the worker starts (the check re-renders and re-encodes each turn: the worker's largest cost). */
  readonly tokenizationCheckEvery: number;
  /** A registered tool-call parser; null: the model family's. */
  readonly toolParser: string | null;
  readonly defaultAgent: string;
  readonly agentLoops: Readonly<Record<string, Readonly<UserCodeRef>>>;
  readonly interactions: Readonly<Record<string, Readonly<UserCodeRef>>>;
  /** null temperature, top_p, top_k, stop_token_ids: the model directory's; max_new_tokens null in the section: response_length. */
  readonly sampling: Readonly<Omit<SamplingParams, 'temperature' | 'top_p' | 'top_k' | 'stop_token_ids'> & { temperature: number | null; top_p: number | null; top_k: number | null; stop_token_ids: readonly number[] | null }>;
  readonly interrupt: RolloutInterrupt;
  /** Passes over a finite dataset; null repeats forever. */
  readonly epochs: number | null;
  readonly split: string;
  readonly templateKwargs: Readonly<Record<string, unknown>>;
  readonly pollIntervalMs: number;
}

/** What a run knows beside the section, for completeRolloutOptions. */
export interface RolloutRun {
  /** trainer.groups_per_step: the staleness gate counts groups in the trainer's steps. */
  readonly groupsPerStep: number;
  /** trainer.staleness_bound (one bound for both ends of the gate); null turns the gate off (a standalone evaluation, a benchmark). */
  readonly stalenessBound: number | null;
  /** The task's, recorded in each trajectory's DatasetRef. */
  readonly datasetName: string;
  /** The model's defaults for what the section leaves null: its family's tool-call parser, generation_config.json's sampling (null: none) and its stop tokens. */
  readonly model: { readonly toolParser: string; readonly temperature: number | null; readonly topP: number | null; readonly topK: number | null; readonly stopTokenIds: readonly number[] };
}

/** The rollout worker's options (and the serve endpoint's): the compiled section completed by the run, nothing left to default. */
export interface RolloutOptions extends Omit<RolloutConfig, 'toolParser' | 'sampling' | 'agentLoops' | 'interactions' | 'interrupt'> {
  readonly toolParser: string;
  readonly sampling: Readonly<SamplingParams>;
  readonly groupsPerStep: number;
  readonly stalenessBound: number | null;
  readonly datasetName: string;
}

/** Compile the `rollout` section of a run config (snake_case, as written in YAML); every error names its path and the fix. */
export function compileRolloutSection(raw: unknown, path = 'rollout'): RolloutConfig {
  const r = compileValue(RolloutSection, raw ?? {}, path);
  const s = r.sampling;
  const refs = (m: Record<string, UserCodeRef>) => Object.freeze(Object.fromEntries(Object.entries(m).map(([k, v]) => [k, Object.freeze({ ...v })])));
  return Object.freeze({
    n: r.n,
    concurrency: r.concurrency,
    maxInflightTrajectories: r.max_inflight_trajectories ?? 2 * r.concurrency,
    maxAssistantTurns: r.max_assistant_turns,
    maxUserTurns: r.max_user_turns,
    responseLength: r.response_length,
    maxParallelToolCalls: r.max_parallel_tool_calls,
    maxToolErrors: r.max_tool_errors,
    tokenizationCheck: r.tokenization_check,
    tokenizationCheckEvery: r.tokenization_check_every,
    toolParser: r.tool_parser,
    defaultAgent: r.default_agent,
    agentLoops: refs(r.agent_loops),
    interactions: refs(r.interactions),
    sampling: Object.freeze({
      temperature: s.temperature,
      top_p: s.top_p,
      top_k: s.top_k,
      max_new_tokens: s.max_new_tokens ?? r.response_length,
      seed: s.seed,
      stop_token_ids: s.stop_token_ids === undefined ? null : Object.freeze([...s.stop_token_ids]),
    }),
    interrupt: r.interrupt,
    epochs: r.epochs,
    split: r.split,
    templateKwargs: Object.freeze({ ...r.template_kwargs }),
    pollIntervalMs: r.poll_interval_ms,
  });
}

/**
 * The worker's options: the compiled section, its nulls filled from the model (the section's value first, then the
 * model directory's, then SAMPLING_FALLBACK), and the run's staleness gate and dataset name.
 */
export function completeRolloutOptions(config: RolloutConfig, run: RolloutRun): RolloutOptions {
  const { toolParser: configured, sampling: s, agentLoops: _loops, interactions: _interactions, interrupt: _interrupt, ...rest } = config;
  const parser = configured ?? run.model.toolParser;
  // The section's name was checked by its schema; the model's comes from code (toolParserForFamily).
  if (!toolParser(parser)) throw new RlstreamError('INTERNAL', `the model's tool-call parser "${parser}" is not registered (known: ${toolParserNames().join(', ')})`);
  return Object.freeze({
    ...rest,
    toolParser: parser,
    sampling: Object.freeze({
      temperature: s.temperature ?? run.model.temperature ?? SAMPLING_FALLBACK.temperature,
      top_p: s.top_p ?? run.model.topP ?? SAMPLING_FALLBACK.top_p,
      top_k: s.top_k ?? run.model.topK ?? SAMPLING_FALLBACK.top_k,
      max_new_tokens: s.max_new_tokens,
      seed: s.seed,
      stop_token_ids: Object.freeze([...(s.stop_token_ids ?? run.model.stopTokenIds)]) as number[],
    }),
    groupsPerStep: run.groupsPerStep,
    stalenessBound: run.stalenessBound,
    datasetName: run.datasetName,
  });
}

/**
 * The `rollout:` section of a run config. groups_per_step and staleness_bound are not here: they are the trainer's
 * (trainer.*), so both ends of the staleness gate use one value; dataset_name comes from the task.
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
    tool_parser: Type.Unsafe<string | null>({ type: ['string', 'null'], enum: [...toolParserNames(), null], default: null, description: "Tool-call parser by name: hermes (Qwen2.5, Qwen3), llama3_json (Llama 3.1+), mistral; null: the model family's (model.config's model_type), hermes without one." }),
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
        temperature: numberOrNull({ minimum: 0, default: null, description: `Sampling temperature (0: greedy; null: the model directory's generation_config.json, else ${SAMPLING_FALLBACK.temperature}).` }),
        top_p: numberOrNull({ exclusiveMinimum: 0, maximum: 1, default: null, description: `Nucleus sampling mass (null: the model directory's generation_config.json, else ${SAMPLING_FALLBACK.top_p}).` }),
        top_k: intOrNull({ minimum: 0, default: null, description: `Top-k (0: off; null: generation_config.json's, else ${SAMPLING_FALLBACK.top_k}).` }),
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
