-- TrainStep v2 records the ids of the trajectories a step dropped as stale, so every started trajectory is
-- accounted for (trained on once, dropped as stale, aborted or dead-lettered).
ALTER TABLE train_steps ADD COLUMN IF NOT EXISTS dropped_trajectory_ids Array(String) CODEC(ZSTD(1));
