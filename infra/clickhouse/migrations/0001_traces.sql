-- rlstream traces, current ClickHouse (26.x; chDB). One table per question area; every table is a
-- ReplacingMergeTree keyed by the natural identity of its fact, versioned by the event time, so an event
-- delivered twice (retry, replay) collapses to one row: read with FINAL (or argMax) where counts matter.
-- Partitions are months of event time (cheap time filters and retention); sort keys start with the run.
-- Token ids, log-probs and masks stay arrays. The 18.16 variant is 0001_traces.compat-18.sql.

CREATE TABLE IF NOT EXISTS trajectory_starts (
  run_id LowCardinality(String),
  trajectory_id String,
  group_id String,
  sample_index UInt32,
  group_size UInt32,
  agent_name LowCardinality(String),
  data_source LowCardinality(String),
  dataset_name LowCardinality(String),
  split LowCardinality(String),
  dataset_index Int64,
  prompt_roles Array(LowCardinality(String)),
  prompt_contents Array(String) CODEC(ZSTD(1)),
  prompt_token_ids Array(UInt32) CODEC(ZSTD(1)),
  tool_names Array(LowCardinality(String)),
  tools_json String CODEC(ZSTD(1)),
  sampling_json String CODEC(ZSTD(1)),
  policy_version Int64,
  ground_truth String CODEC(ZSTD(1)),
  extra_info_json String CODEC(ZSTD(1)),
  event_id String,
  time DateTime64(3),
  _version UInt64,
  INDEX idx_policy_version policy_version TYPE minmax GRANULARITY 4
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id);

CREATE TABLE IF NOT EXISTS trajectories (
  run_id LowCardinality(String),
  trajectory_id String,
  group_id String,
  sample_index UInt32,
  group_size UInt32,
  agent_name LowCardinality(String),
  data_source LowCardinality(String),
  dataset_name LowCardinality(String),
  split LowCardinality(String),
  dataset_index Int64,
  ground_truth String CODEC(ZSTD(1)),
  prompt_ids Array(UInt32) CODEC(ZSTD(1)),
  response_ids Array(UInt32) CODEC(ZSTD(1)),
  response_mask Array(UInt8) CODEC(ZSTD(1)),
  response_logprobs Array(Float32) CODEC(ZSTD(1)),
  response_policy_versions Array(Int64) CODEC(ZSTD(1)),
  turn_offsets Array(UInt32),
  turn_roles Array(LowCardinality(String)),
  response_text String CODEC(ZSTD(1)),
  num_turns UInt32,
  num_tool_calls UInt32,
  num_tool_errors UInt32,
  num_invalid_tool_calls UInt32,
  termination LowCardinality(String),
  min_policy_version Int64,
  max_policy_version Int64,
  started DateTime64(3),
  completed DateTime64(3),
  generation_ms Float64,
  tool_ms Float64,
  event_id String,
  time DateTime64(3),
  _version UInt64,
  INDEX idx_policy_version min_policy_version TYPE minmax GRANULARITY 4
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id);

CREATE TABLE IF NOT EXISTS turns (
  run_id LowCardinality(String),
  trajectory_id String,
  group_id String,
  turn_index UInt32,
  role LowCardinality(String),
  token_ids Array(UInt32) CODEC(ZSTD(1)),
  logprobs Array(Float32) CODEC(ZSTD(1)),
  loss_mask Array(UInt8) CODEC(ZSTD(1)),
  num_tokens UInt32,
  text String CODEC(ZSTD(1)),
  tool_call_ids Array(String),
  tool_call_names Array(LowCardinality(String)),
  tool_call_arguments Array(String) CODEC(ZSTD(1)),
  tool_call_parse_error Nullable(String),
  finish_reason LowCardinality(String),
  policy_version Int64,
  latency_ms Float64,
  server LowCardinality(String),
  tokenization_mismatch UInt8,
  event_id String,
  time DateTime64(3),
  _version UInt64,
  INDEX idx_policy_version policy_version TYPE minmax GRANULARITY 4
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, turn_index);

CREATE TABLE IF NOT EXISTS tool_calls (
  run_id LowCardinality(String),
  trajectory_id String,
  group_id String,
  turn_index UInt32,
  call_id String,
  tool_name LowCardinality(String),
  arguments_json String CODEC(ZSTD(1)),
  status LowCardinality(String),
  result_text String CODEC(ZSTD(1)),
  latency_ms Float64,
  reward Float64,
  metric_names Array(LowCardinality(String)),
  metric_values Array(Float64),
  event_id String,
  time DateTime64(3),
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, turn_index, call_id);

CREATE TABLE IF NOT EXISTS rewards (
  run_id LowCardinality(String),
  trajectory_id String,
  group_id String,
  reward_fn LowCardinality(String),
  score Float64,
  correct Nullable(UInt8),
  component_names Array(LowCardinality(String)),
  component_values Array(Float64),
  token_rewards Array(Float32) CODEC(ZSTD(1)),
  agent_name LowCardinality(String),
  data_source LowCardinality(String),
  split LowCardinality(String),
  num_turns UInt32,
  response_tokens UInt32,
  min_policy_version Int64,
  max_policy_version Int64,
  event_id String,
  time DateTime64(3),
  _version UInt64,
  INDEX idx_policy_version min_policy_version TYPE minmax GRANULARITY 4
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, reward_fn);

CREATE TABLE IF NOT EXISTS advantages (
  run_id LowCardinality(String),
  trajectory_id String,
  group_id String,
  estimator LowCardinality(String),
  reward_fn LowCardinality(String),
  score Float64,
  advantages Array(Float32) CODEC(ZSTD(1)),
  returns Array(Float32) CODEC(ZSTD(1)),
  group_members UInt32,
  expected_size UInt32,
  reward_mean Float64,
  reward_std Float64,
  partial UInt8,
  split LowCardinality(String),
  min_policy_version Int64,
  max_policy_version Int64,
  event_id String,
  time DateTime64(3),
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, trajectory_id, estimator);

CREATE TABLE IF NOT EXISTS train_steps (
  run_id LowCardinality(String),
  step Int64,
  policy_version Int64,
  produced_version Nullable(Int64),
  trajectories UInt32,
  tokens UInt64,
  trajectory_ids Array(String) CODEC(ZSTD(1)),
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
  metric_names Array(LowCardinality(String)),
  metric_values Array(Float64),
  event_id String,
  time DateTime64(3),
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, step);

CREATE TABLE IF NOT EXISTS policy_versions (
  run_id LowCardinality(String),
  version Int64,
  parent Nullable(Int64),
  step Int64,
  weights_uri String,
  checksum String,
  format LowCardinality(String),
  config_json String CODEC(ZSTD(1)),
  metric_names Array(LowCardinality(String)),
  metric_values Array(Float64),
  event_id String,
  time DateTime64(3),
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, version);

CREATE TABLE IF NOT EXISTS control (
  run_id LowCardinality(String),
  command LowCardinality(String),
  staleness_bound Nullable(Int32),
  reason String,
  issued_by String,
  event_id String,
  time DateTime64(3),
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, time, event_id);

-- Poison records are kept for 90 days: long enough to debug, short enough not to grow without bound.
CREATE TABLE IF NOT EXISTS dead_letters (
  consumer LowCardinality(String),
  source_topic LowCardinality(String),
  source_partition Int32,
  source_offset Int64,
  error_code LowCardinality(String),
  error String CODEC(ZSTD(1)),
  key_base64 String,
  value_base64 String CODEC(ZSTD(1)),
  value_bytes UInt32,
  event_id String,
  time DateTime64(3),
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (source_topic, source_partition, source_offset, event_id)
TTL toDateTime(time) + INTERVAL 90 DAY;
