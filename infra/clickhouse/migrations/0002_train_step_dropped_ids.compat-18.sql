-- ClickHouse 18.16: no IF NOT EXISTS on ADD COLUMN and no codecs; schema_migrations keeps this from re-running.
ALTER TABLE train_steps ADD COLUMN dropped_trajectory_ids Array(String);
