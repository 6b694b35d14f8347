-- Evaluation events (train.steps), for ClickHouse 18.16: no LowCardinality, DateTime64 or codecs.
CREATE TABLE IF NOT EXISTS evaluations (
  run_id String,
  policy_version Int64,
  step Nullable(Int64),
  phase String,
  problem_set String,
  n Int32,
  solved Int32,
  solved_rule String,
  mean_reward Float64,
  difficulty_names Array(String),
  difficulty_n Array(Int32),
  difficulty_solved Array(Int32),
  difficulty_mean_reward Array(Float64),
  trajectory_ids Array(String),
  event_id String,
  time DateTime,
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, policy_version, event_id);
