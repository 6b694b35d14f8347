// The tasks shipped with rlstream, each registering itself under its name when imported. A new built-in
// task adds one line here; a task of one's own needs none (task.module in its config, or the files task).
import './calculator/index.ts';
import './gsm8k-tool/index.ts';
