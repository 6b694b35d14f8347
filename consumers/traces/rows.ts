// Event → trace rows: the one mapping from the event contract to the tables of
// infra/clickhouse/migrations. Pure functions, shared by the live sink, replay and the benchmark.
// Times are epoch milliseconds (stores convert per dialect); `_version` is the event time, so when two
// different events claim the same row identity, the later one wins, and an identical redelivery is a no-op.
// Rows of the high-volume tables are single object literals, never spreads: V8 builds an object literal with a
// spread in the middle through a slow path that gives every row its own hidden class, and reading a column
// across thousands of distinct classes (the RowBinary encoder does it per value) is megamorphic and slow.
import type { DecodedEvent } from '../../core/serde/events.ts';
import type { Row, TraceTable } from '../../core/traces/store.ts';
import type { NamedValue } from '../../schemas/generated/types.ts';

export interface TraceRow {
  table: TraceTable;
  row: Row;
}

function meta(e: { event_id: string; time_ms: number }): Row {
  return { event_id: e.event_id, time: e.time_ms, _version: e.time_ms };
}

function names(v: NamedValue[]): string[] {
  return v.map((x) => x.name);
}

function values(v: NamedValue[]): number[] {
  return v.map((x) => x.value);
}

/** The rows one event becomes (one row for every event type but Evaluation, which has no table). */
export function rowsOf(ev: DecodedEvent): TraceRow[] {
  switch (ev.name) {
    case 'TrajectoryStarted': {
      const e = ev.value;
      return [
        {
          table: 'trajectory_starts',
          row: {
            run_id: e.run_id,
            trajectory_id: e.trajectory_id,
            group_id: e.group_id,
            sample_index: e.sample_index,
            group_size: e.group_size,
            agent_name: e.agent_name,
            data_source: e.data_source,
            dataset_name: e.dataset.name,
            split: e.dataset.split,
            dataset_index: e.dataset.index,
            prompt_roles: e.prompt_messages.map((m) => m.role),
            prompt_contents: e.prompt_messages.map((m) => m.content),
            prompt_token_ids: e.prompt_token_ids,
            tool_names: e.tools.map((t) => t.name),
            tools_json: JSON.stringify(e.tools),
            sampling_json: JSON.stringify(e.sampling),
            policy_version: e.policy_version,
            ground_truth: e.ground_truth,
            extra_info_json: e.extra_info_json,
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'TurnCompleted': {
      const e = ev.value;
      return [
        {
          table: 'turns',
          row: {
            run_id: e.run_id,
            trajectory_id: e.trajectory_id,
            group_id: e.group_id,
            turn_index: e.turn_index,
            role: e.role,
            token_ids: e.token_ids,
            logprobs: e.logprobs,
            // The column keeps its first name: ClickHouse 18.16 (the compat-18 dialect) cannot rename a column.
            loss_mask: e.response_mask,
            num_tokens: e.token_ids.length,
            text: e.text,
            tool_call_ids: e.tool_calls.map((c) => c.id),
            tool_call_names: e.tool_calls.map((c) => c.name),
            tool_call_arguments: e.tool_calls.map((c) => c.arguments_json),
            tool_call_parse_error: e.tool_call_parse_error,
            finish_reason: e.finish_reason ?? '',
            policy_version: e.policy_version,
            latency_ms: e.latency_ms,
            server: e.server ?? '',
            tokenization_mismatch: e.tokenization_mismatch ? 1 : 0,
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'ToolCallCompleted': {
      const e = ev.value;
      return [
        {
          table: 'tool_calls',
          row: {
            run_id: e.run_id,
            trajectory_id: e.trajectory_id,
            group_id: e.group_id,
            turn_index: e.turn_index,
            call_id: e.call_id,
            tool_name: e.tool_name,
            arguments_json: e.arguments_json,
            status: e.status,
            result_text: e.result_text,
            latency_ms: e.latency_ms,
            reward: e.reward,
            metric_names: names(e.metrics),
            metric_values: values(e.metrics),
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'TrajectoryCompleted': {
      const e = ev.value;
      const t = e.trajectory;
      return [
        {
          table: 'trajectories',
          row: {
            run_id: t.run_id,
            trajectory_id: t.trajectory_id,
            group_id: t.group_id,
            sample_index: t.sample_index,
            group_size: t.group_size,
            agent_name: t.agent_name,
            data_source: t.data_source,
            dataset_name: t.dataset.name,
            split: t.dataset.split,
            dataset_index: t.dataset.index,
            ground_truth: t.ground_truth,
            prompt_ids: t.prompt_ids,
            response_ids: t.response_ids,
            response_mask: t.response_mask,
            response_logprobs: t.response_logprobs,
            response_policy_versions: t.response_policy_versions,
            turn_offsets: t.turn_offsets,
            turn_roles: t.turn_roles,
            response_text: t.response_text,
            num_turns: t.num_turns,
            num_tool_calls: t.num_tool_calls,
            num_tool_errors: t.num_tool_errors,
            num_invalid_tool_calls: t.num_invalid_tool_calls,
            termination: t.termination,
            min_policy_version: t.min_policy_version,
            max_policy_version: t.max_policy_version,
            started: t.started_ms,
            completed: t.completed_ms,
            generation_ms: t.generation_ms,
            tool_ms: t.tool_ms,
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'RewardedTrajectory': {
      const e = ev.value;
      const t = e.trajectory;
      return [
        {
          table: 'rewards',
          row: {
            run_id: t.run_id,
            trajectory_id: t.trajectory_id,
            group_id: t.group_id,
            reward_fn: e.reward.reward_fn,
            score: e.reward.score,
            correct: e.reward.correct === null ? null : e.reward.correct ? 1 : 0,
            component_names: names(e.reward.components),
            component_values: values(e.reward.components),
            token_rewards: e.reward.token_rewards ?? [],
            agent_name: t.agent_name,
            data_source: t.data_source,
            split: t.dataset.split,
            num_turns: t.num_turns,
            response_tokens: t.response_ids.length,
            min_policy_version: t.min_policy_version,
            max_policy_version: t.max_policy_version,
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'AdvantagedTrajectory': {
      const e = ev.value;
      const t = e.trajectory;
      return [
        {
          table: 'advantages',
          row: {
            run_id: t.run_id,
            trajectory_id: t.trajectory_id,
            group_id: t.group_id,
            estimator: e.estimator,
            reward_fn: e.reward.reward_fn,
            score: e.reward.score,
            advantages: e.advantages,
            returns: e.returns,
            group_members: e.group.group_members,
            expected_size: e.group.expected_size,
            reward_mean: e.group.reward_mean,
            reward_std: e.group.reward_std,
            partial: e.group.partial ? 1 : 0,
            split: t.dataset.split,
            min_policy_version: t.min_policy_version,
            max_policy_version: t.max_policy_version,
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'TrainStep': {
      const { metrics, event_id: _id, time_ms: _t, ...rest } = ev.value;
      return [{ table: 'train_steps', row: { ...rest, metric_names: names(metrics), metric_values: values(metrics), ...meta(ev.value) } }];
    }
    case 'PolicyVersion': {
      const { metrics, event_id: _id, time_ms: _t, policy_version, ...rest } = ev.value;
      // The column keeps the field's first name (version): ClickHouse 18.16 (the compat-18 dialect) cannot rename a column.
      return [{ table: 'policy_versions', row: { ...rest, version: policy_version, metric_names: names(metrics), metric_values: values(metrics), ...meta(ev.value) } }];
    }
    case 'Control': {
      const e = ev.value;
      return [
        {
          table: 'control',
          row: {
            run_id: e.run_id,
            command: e.command,
            staleness_bound: e.staleness_bound,
            reason: e.reason ?? '',
            issued_by: e.issued_by ?? '',
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'Evaluation': {
      const e = ev.value;
      const slices = e.per_difficulty;
      return [
        {
          table: 'evaluations',
          row: {
            run_id: e.run_id,
            policy_version: e.policy_version,
            step: e.step,
            phase: e.phase,
            problem_set: e.problem_set,
            n: e.n,
            solved: e.solved,
            solved_rule: e.solved_rule,
            mean_reward: e.mean_reward,
            difficulty_names: slices.map((d) => d.difficulty),
            difficulty_n: slices.map((d) => d.n),
            difficulty_solved: slices.map((d) => d.solved),
            difficulty_mean_reward: slices.map((d) => d.mean_reward),
            trajectory_ids: e.trajectory_ids,
            event_id: e.event_id,
            time: e.time_ms,
            _version: e.time_ms,
          },
        },
      ];
    }
    case 'DeadLetter': {
      const e = ev.value;
      return [{ table: 'dead_letters', row: deadLetterRow(e.consumer, e.source_topic, e.source_partition, e.source_offset, e.error_code, e.error, e.key, e.value, e.event_id, e.time_ms) }];
    }
  }
}

/** A dead_letters row; also what the sink writes for records it cannot decode itself. */
export function deadLetterRow(
  consumer: string,
  topic: string,
  partition: number,
  offset: number,
  errorCode: string,
  error: string,
  key: Buffer | null,
  value: Buffer,
  eventId: string,
  timeMs: number,
): Row {
  return {
    consumer,
    source_topic: topic,
    source_partition: partition,
    source_offset: offset,
    error_code: errorCode,
    error,
    key_base64: key ? key.toString('base64') : '',
    value_base64: value.toString('base64'),
    value_bytes: value.length,
    event_id: eventId,
    time: timeMs,
    _version: timeMs,
  };
}
