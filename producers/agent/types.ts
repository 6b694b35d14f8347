// The agent-loop contract (verl's AgentLoopBase): a loop gets one trajectory's context — prompt tokens,
// backend, tools, tokenizer, limits — appends every turn through the recorder, and returns why it
// stopped. The worker does everything around it (ids, events, publishing, rewards of tools, cleanup).
import type { Logger } from '../../core/telemetry.ts';
import type { SamplingParams, Termination } from '../../schemas/generated/types.ts';
import type { LlmBackend } from '../backends/types.ts';
import type { DatasetRow } from '../dataset/types.ts';
import type { ChatMessage, ChatTokenizer, ChatTool } from '../tokenizer/chat-tokenizer.ts';
import type { DeltaTokenizer, TokenizationCheckMode } from '../tokenizer/delta.ts';
import type { ToolSession } from '../tools/tool-set.ts';
import type { Interaction } from './interaction.ts';
import type { TrajectoryRecorder } from './recorder.ts';
import type { ToolParser } from './tool-parser.ts';

/** Limits a loop honours (compiled from the rollout options; see producers/options.ts). */
export interface AgentLimits {
  /** Generated turns before the loop stops with 'max_turns'. */
  maxAssistantTurns: number;
  /** Tool-response and user turns before the loop stops with 'max_turns'. */
  maxUserTurns: number;
  /** Response tokens (all turns, masked ones included); the trajectory is cut to it ('max_tokens'). */
  responseLength: number;
  /** Tool calls executed per assistant turn; further calls in the same turn are ignored. */
  maxParallelToolCalls: number;
  /** Failed tool calls (any status but ok, undecodable calls included) before 'tool_error_limit'. */
  maxToolErrors: number;
  tokenizationCheck: TokenizationCheckMode;
}

export interface AgentContext {
  readonly trajectoryId: string;
  readonly row: DatasetRow;
  /** The conversation so far; loops append assistant, tool and user messages to it. */
  readonly messages: ChatMessage[];
  /** Tools offered to the model (what the prompt was rendered with). */
  readonly tools: ChatTool[];
  readonly sampling: SamplingParams;
  readonly limits: AgentLimits;
  readonly backend: LlmBackend;
  readonly tokenizer: ChatTokenizer;
  readonly delta: DeltaTokenizer;
  readonly toolParser: ToolParser;
  /** Null when the run has no tools. */
  readonly toolSession: ToolSession | null;
  /** Present when the row names an interaction the worker knows. */
  readonly interaction: { interaction: Interaction; instanceId: string; kwargs: Record<string, unknown> } | null;
  readonly recorder: TrajectoryRecorder;
  readonly signal: AbortSignal;
  readonly logger: Logger;
  /** Count a metric (the worker aggregates them in its snapshot). */
  count(name: string, by?: number): void;
}

export interface AgentLoop {
  readonly name: string;
  /** Offer the run's tools in the prompt and open a tool session (default false). */
  readonly usesTools?: boolean;
  run(ctx: AgentContext): Promise<Termination>;
}
