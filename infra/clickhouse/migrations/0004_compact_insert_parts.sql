-- Parts written by the sink's inserts (at most the writer's 64 MiB a flush) stay Compact: one data file for all
-- columns instead of two files per column. A wide part of `turns` is ~50 files, and creating them costs the
-- engine a large share of its insert CPU in the kernel (ext4 inode allocation; see docs/benchmarks.md).
-- Merged parts above 128 MiB become Wide again, the layout reads of a few columns prefer.
ALTER TABLE turns MODIFY SETTING min_bytes_for_wide_part = 134217728;
ALTER TABLE trajectories MODIFY SETTING min_bytes_for_wide_part = 134217728;
ALTER TABLE trajectory_starts MODIFY SETTING min_bytes_for_wide_part = 134217728;
ALTER TABLE tool_calls MODIFY SETTING min_bytes_for_wide_part = 134217728;
ALTER TABLE rewards MODIFY SETTING min_bytes_for_wide_part = 134217728;
ALTER TABLE advantages MODIFY SETTING min_bytes_for_wide_part = 134217728;
