-- Evaluation events (train.steps): one row per evaluation of one policy version on a named problem set, so
-- `rlstream query` selects them beside the steps. Accuracy is solved / n; per_difficulty is three parallel arrays.
CREATE TABLE IF NOT EXISTS evaluations (
  run_id LowCardinality(String),
  policy_version Int64,
  step Nullable(Int64),
  phase LowCardinality(String),
  problem_set String,
  n Int32,
  solved Int32,
  solved_rule String,
  mean_reward Float64,
  difficulty_names Array(String),
  difficulty_n Array(Int32),
  difficulty_solved Array(Int32),
  difficulty_mean_reward Array(Float64),
  trajectory_ids Array(String) CODEC(ZSTD(1)),
  event_id String,
  time DateTime64(3),
  _version UInt64
) ENGINE = ReplacingMergeTree(_version)
PARTITION BY toYYYYMM(time)
ORDER BY (run_id, policy_version, event_id);
