// TrajectoryRecorder: the single place a trajectory's tokens are appended. Each turn added here is
// emitted at once as a TurnCompleted event (and each tool call as ToolCallCompleted), and finish()
// assembles the Trajectory from the same arrays, so events and the trajectory cannot disagree.
// Assistant tokens get loss mask 1 and their log-probs / policy versions; tool and user tokens mask 0.
import { deriveId } from '../../core/ids.ts';
import type { DatasetRef, Termination, ToolCall, ToolCallCompleted, Trajectory, TurnCompleted, TurnRole } from '../../schemas/generated/types.ts';
import type { GenerateResult } from '../backends/types.ts';
import type { ChatTokenizer } from '../tokenizer/chat-tokenizer.ts';
import type { ToolCallOutcome } from '../tools/tool-set.ts';

export interface TrajectoryMeta {
  runId: string;
  trajectoryId: string;
  groupId: string;
  sampleIndex: number;
  groupSize: number;
  agentName: string;
  dataSource: string;
  dataset: DatasetRef;
  groundTruth: string;
  extraInfoJson: string;
}

/** Where events go (the worker publishes them in the order given). */
export interface EventSink {
  turn(event: TurnCompleted): void;
  toolCall(event: ToolCallCompleted): void;
}

export class TrajectoryRecorder {
  readonly responseIds: number[] = [];
  readonly mask: number[] = [];
  readonly logprobs: number[] = [];
  readonly versions: number[] = [];
  readonly turnOffsets: number[] = [];
  readonly turnRoles: TurnRole[] = [];
  readonly toolRewards: number[] = [];
  readonly interactionRewards: number[] = [];
  numToolCalls = 0;
  numToolErrors = 0;
  numInvalidToolCalls = 0;
  generationMs = 0;
  toolMs = 0;
  tokenizationMismatches = 0;
  readonly startedMs = Date.now();

  constructor(
    readonly meta: TrajectoryMeta,
    readonly promptIds: readonly number[],
    private readonly tokenizer: ChatTokenizer,
    private readonly sink: EventSink,
  ) {}

  get responseLength(): number {
    return this.responseIds.length;
  }

  get turnCount(): number {
    return this.turnRoles.length;
  }

  /** The whole context: prompt then every turn so far (what the next generation continues). */
  contextIds(): number[] {
    return this.promptIds.length === 0 ? [...this.responseIds] : this.promptIds.concat(this.responseIds);
  }

  private push(role: TurnRole, ids: readonly number[], mask: 0 | 1, logprobs: readonly number[] | null, versions: readonly number[] | null): number {
    const turn = this.turnRoles.length;
    this.turnOffsets.push(this.responseIds.length);
    this.turnRoles.push(role);
    for (let i = 0; i < ids.length; i++) {
      this.responseIds.push(ids[i]!);
      this.mask.push(mask);
      this.logprobs.push(logprobs ? (logprobs[i] ?? 0) : 0);
      this.versions.push(versions ? (versions[i] ?? -1) : -1);
    }
    return turn;
  }

  /** Append a generated turn; `text` is what the turn decodes to (special tokens skipped). */
  addAssistant(gen: GenerateResult, text: string, toolCalls: ToolCall[], parseError: string | null): number {
    const turn = this.push('assistant', gen.tokenIds, 1, gen.logprobs, gen.policyVersions);
    this.generationMs += gen.latencyMs;
    this.sink.turn({
      event_id: deriveId(this.meta.trajectoryId, 'turn', turn),
      time_ms: Date.now(),
      run_id: this.meta.runId,
      trajectory_id: this.meta.trajectoryId,
      group_id: this.meta.groupId,
      turn_index: turn,
      role: 'assistant',
      token_ids: gen.tokenIds,
      logprobs: gen.logprobs,
      loss_mask: gen.tokenIds.map(() => 1),
      text,
      tool_calls: toolCalls,
      tool_call_parse_error: parseError,
      finish_reason: gen.finishReason,
      policy_version: gen.policyVersions[0] ?? -1,
      latency_ms: gen.latencyMs,
      server: gen.server,
      tokenization_mismatch: false,
    });
    return turn;
  }

  /** Append tool or user tokens (loss mask 0). */
  addObservation(role: 'tool' | 'user', ids: readonly number[], latencyMs: number, tokenizationMismatch: boolean): number {
    const turn = this.push(role, ids, 0, null, null);
    if (tokenizationMismatch) this.tokenizationMismatches++;
    this.sink.turn({
      event_id: deriveId(this.meta.trajectoryId, 'turn', turn),
      time_ms: Date.now(),
      run_id: this.meta.runId,
      trajectory_id: this.meta.trajectoryId,
      group_id: this.meta.groupId,
      turn_index: turn,
      role,
      token_ids: [...ids],
      logprobs: [],
      loss_mask: ids.map(() => 0),
      text: this.tokenizer.decode(ids, { skipSpecialTokens: true }),
      tool_calls: [],
      tool_call_parse_error: null,
      finish_reason: null,
      policy_version: -1,
      latency_ms: latencyMs,
      server: null,
      tokenization_mismatch: tokenizationMismatch,
    });
    return turn;
  }

  /** Record one finished tool call; `turnIndex` is the assistant turn that made it. */
  addToolCall(turnIndex: number, call: ToolCall, outcome: ToolCallOutcome): void {
    this.numToolCalls++;
    if (outcome.status !== 'ok') this.numToolErrors++;
    if (outcome.status === 'invalid_args' || outcome.status === 'unknown_tool') this.numInvalidToolCalls++;
    this.toolRewards.push(outcome.reward);
    this.sink.toolCall({
      event_id: deriveId(this.meta.trajectoryId, 'tool', call.id),
      time_ms: Date.now(),
      run_id: this.meta.runId,
      trajectory_id: this.meta.trajectoryId,
      group_id: this.meta.groupId,
      turn_index: turnIndex,
      call_id: call.id,
      tool_name: call.name,
      arguments_json: call.arguments_json,
      status: outcome.status,
      result_text: outcome.text,
      latency_ms: outcome.latencyMs,
      reward: outcome.reward,
      metrics: Object.entries(outcome.metrics).map(([name, value]) => ({ name, value })),
    });
  }

  /** Count a tool call that could not be decoded (no ToolCallCompleted: there is no call to report). */
  addParseFailure(): void {
    this.numInvalidToolCalls++;
    this.numToolErrors++;
  }

  /** The assembled trajectory, cut to `responseLimit` tokens (the max response budget). */
  finish(termination: Termination, responseLimit: number): Trajectory {
    const n = Math.min(this.responseIds.length, responseLimit);
    const ids = this.responseIds.slice(0, n);
    let minV = Infinity;
    let maxV = -Infinity;
    for (let i = 0; i < n; i++) {
      const v = this.versions[i]!;
      if (v < 0) continue;
      if (v < minV) minV = v;
      if (v > maxV) maxV = v;
    }
    const offsets: number[] = [];
    const roles: string[] = [];
    this.turnOffsets.forEach((o, i) => {
      if (o < n) {
        offsets.push(o);
        roles.push(this.turnRoles[i]!);
      }
    });
    return {
      run_id: this.meta.runId,
      trajectory_id: this.meta.trajectoryId,
      group_id: this.meta.groupId,
      sample_index: this.meta.sampleIndex,
      group_size: this.meta.groupSize,
      agent_name: this.meta.agentName,
      data_source: this.meta.dataSource,
      dataset: this.meta.dataset,
      ground_truth: this.meta.groundTruth,
      extra_info_json: this.meta.extraInfoJson,
      prompt_ids: [...this.promptIds],
      response_ids: ids,
      response_mask: this.mask.slice(0, n),
      response_logprobs: this.logprobs.slice(0, n),
      response_policy_versions: this.versions.slice(0, n),
      turn_offsets: offsets,
      turn_roles: roles,
      response_text: this.tokenizer.decode(ids, { skipSpecialTokens: true }),
      num_turns: roles.length,
      num_tool_calls: this.numToolCalls,
      num_tool_errors: this.numToolErrors,
      num_invalid_tool_calls: this.numInvalidToolCalls,
      tool_rewards: [...this.toolRewards],
      interaction_rewards: [...this.interactionRewards],
      termination,
      min_policy_version: maxV >= 0 ? minV : -1,
      max_policy_version: maxV >= 0 ? maxV : -1,
      started_ms: this.startedMs,
      completed_ms: Date.now(),
      generation_ms: this.generationMs,
      tool_ms: this.toolMs,
    };
  }
}
