-- rlstream traces, ClickHouse 18.16 variant of 0001_traces.sql (same tables, columns and keys).
-- 18.16 lacks LowCardinality, DateTime64, column CODECs, TTL and data-skipping indices, so: String for
-- LowCardinality(String), DateTime (seconds) for DateTime64(3), no codecs, no indices, no retention TTL.

CREATE TABLE IF NOT EXISTS trajectory_starts (
  run_id String,
  trajectory_id String,
  group_id String,
  sample_index UInt32,
  group_size UInt32,
  agent_name String,
  data_source String,
  dataset_name String,
  split String,
  dataset_index Int64,
  prompt_roles Array(String),
  prompt_contents Array(String),
  prompt_token_ids Array(UInt32),
  tool_names Array(String),
  tools_json String,
  sampling_json String,
  policy_version Int64,
  ground_truth String,
  extra_info_json String,
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id);

CREATE TABLE IF NOT EXISTS trajectories (
  run_id String,
  trajectory_id String,
  group_id String,
  sample_index UInt32,
  group_size UInt32,
  agent_name String,
  data_source String,
  dataset_name String,
  split String,
  dataset_index Int64,
  ground_truth String,
  prompt_ids Array(UInt32),
  response_ids Array(UInt32),
  response_mask Array(UInt8),
  response_logprobs Array(Float32),
  response_policy_versions Array(Int64),
  turn_offsets Array(UInt32),
  turn_roles Array(String),
  response_text String,
  num_turns UInt32,
  num_tool_calls UInt32,
  num_tool_errors UInt32,
  num_invalid_tool_calls UInt32,
  termination String,
  min_policy_version Int64,
  max_policy_version Int64,
  started DateTime,
  completed DateTime,
  generation_ms Float64,
  tool_ms Float64,
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id);

CREATE TABLE IF NOT EXISTS turns (
  run_id String,
  trajectory_id String,
  group_id String,
  turn_index UInt32,
  role String,
  token_ids Array(UInt32),
  logprobs Array(Float32),
  loss_mask Array(UInt8),
  num_tokens UInt32,
  text String,
  tool_call_ids Array(String),
  tool_call_names Array(String),
  tool_call_arguments Array(String),
  tool_call_parse_error Nullable(String),
  finish_reason String,
  policy_version Int64,
  latency_ms Float64,
  server String,
  tokenization_mismatch UInt8,
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, turn_index);

CREATE TABLE IF NOT EXISTS tool_calls (
  run_id String,
  trajectory_id String,
  group_id String,
  turn_index UInt32,
  call_id String,
  tool_name String,
  arguments_json String,
  status String,
  result_text String,
  latency_ms Float64,
  reward Float64,
  metric_names Array(String),
  metric_values Array(Float64),
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, turn_index, call_id);

CREATE TABLE IF NOT EXISTS rewards (
  run_id String,
  trajectory_id String,
  group_id String,
  reward_fn String,
  score Float64,
  correct Nullable(UInt8),
  component_names Array(String),
  component_values Array(Float64),
  token_rewards Array(Float32),
  agent_name String,
  data_source String,
  split String,
  num_turns UInt32,
  response_tokens UInt32,
  min_policy_version Int64,
  max_policy_version Int64,
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, reward_fn);

CREATE TABLE IF NOT EXISTS advantages (
  run_id String,
  trajectory_id String,
  group_id String,
  estimator String,
  reward_fn String,
  score Float64,
  advantages Array(Float32),
  returns Array(Float32),
  group_members UInt32,
  expected_size UInt32,
  reward_mean Float64,
  reward_std Float64,
  partial UInt8,
  split String,
  min_policy_version Int64,
  max_policy_version Int64,
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, estimator);

CREATE TABLE IF NOT EXISTS train_steps (
  run_id String,
  step Int64,
  policy_version Int64,
  produced_version Nullable(Int64),
  trajectories UInt32,
  tokens UInt64,
  trajectory_ids Array(String),
  loss Float64,
  pg_loss Float64,
  kl Float64,
  entropy Float64,
  clip_fraction Float64,
  approx_kl Float64,
  grad_norm Float64,
  learning_rate Float64,
  reward_mean Float64,
  staleness_mean Float64,
  staleness_max Int32,
  iw_mean Float64,
  iw_max Float64,
  iw_truncated_fraction Float64,
  dropped_stale Int64,
  wait_ms Float64,
  compute_ms Float64,
  metric_names Array(String),
  metric_values Array(Float64),
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, step);

CREATE TABLE IF NOT EXISTS policy_versions (
  run_id String,
  version Int64,
  parent Nullable(Int64),
  step Int64,
  weights_uri String,
  checksum String,
  format String,
  config_json String,
  metric_names Array(String),
  metric_values Array(Float64),
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, version);

CREATE TABLE IF NOT EXISTS control (
  run_id String,
  command String,
  staleness_bound Nullable(Int32),
  reason String,
  issued_by String,
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, time, event_id);

CREATE TABLE IF NOT EXISTS dead_letters (
  consumer String,
  source_topic String,
  source_partition Int32,
  source_offset Int64,
  error_code String,
  error String,
  key_base64 String,
  value_base64 String,
  value_bytes UInt32,
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (source_topic, source_partition, source_offset, event_id);
