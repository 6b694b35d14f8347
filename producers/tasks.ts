// Tasks as plug-ins. A task bundles what a run needs to know about the problem: its training and held-out
// rows, the reward functions its rows name, its default tools, how a held-out trajectory counts as correct,
// and (optionally) SFT demonstrations. The built-in `files` task reads dataset.train / dataset.heldout, so a
// task of one's own can be written in config alone (dataset files, reward module, tool YAML); a task with
// code registers itself (`registerTask`) or is named by `task.module` / `task.export`.
import { Type, type Static, type TObject } from '@sinclair/typebox';
import { objectShape, Registry } from '../core/config/registry.ts';
import { RlstreamError } from '../core/errors.ts';
import type { SftExample } from '../core/tasks/demonstration.ts';
import type { RewardFn } from '../core/tasks/reward-fn.ts';
import type { Trajectory } from '../schemas/generated/types.ts';
import { loaderFor } from './dataset/loaders.ts';
import type { DatasetRow, RowSource } from './dataset/types.ts';
import type { ChatTokenizer } from './tokenizer/chat-tokenizer.ts';
import type { ToolSet } from './tools/tool-set.ts';

/** The dataset section, compiled (paths absolute). */
export interface DatasetFiles {
  train: string | null;
  heldout: string | null;
  loader: string | null;
}

export interface TaskEnv {
  seed: number;
  /** Directory of the config file. */
  baseDir: string;
  dataset: DatasetFiles;
}

export interface Task {
  /** Recorded as each trajectory's dataset name. */
  readonly datasetName: string;
  /** Training rows of one epoch (a generator may be unbounded). */
  trainRows(epoch: number): RowSource;
  /** The first `n` held-out rows (fewer when the set is smaller). */
  heldoutRows(n: number): Promise<DatasetRow[]>;
  /** Reward functions by the data_source of the task's rows (registered before the reward role starts). */
  readonly rewards?: Readonly<Record<string, RewardFn>>;
  /** The task's tools when tools.config is not set (absent: no tools). */
  tools?(): Promise<ToolSet>;
  /** Held-out accuracy: whether a trajectory is correct (absent: the reward function's `correct`, else score > 0). */
  correct?(trajectory: Trajectory): boolean;
  /** SFT demonstrations for one stage (absent: the task has none, and model.init must exist). */
  sftExamples?(tokenizer: ChatTokenizer, stage: { problems: number; seed: number; options: Record<string, unknown> }): SftExample[] | Promise<SftExample[]>;
}

export interface TaskPlugin<S extends TObject = TObject, F extends TObject = TObject> {
  /** The task's own keys in the `task:` section (besides name, module, export, heldout_problems, train_rows). */
  options: S;
  /** The task's own keys in an SFT stage (besides the optimizer's). */
  sftOptions?: F;
  create(options: Static<S>, env: TaskEnv): Task;
}

export const tasks = new Registry<TaskPlugin>('task', objectShape('a task plug-in ({ options: TypeBox object, create(options, env) })', ['create']));

export function registerTask<S extends TObject, F extends TObject>(name: string, plugin: TaskPlugin<S, F>): void {
  tasks.register(name, plugin);
}

async function firstRows(source: RowSource, n: number): Promise<DatasetRow[]> {
  const out: DatasetRow[] = [];
  if (n <= 0) return out;
  for await (const row of source) {
    out.push(row);
    if (out.length >= n) break;
  }
  return out;
}

registerTask('files', {
  options: Type.Object({}, { additionalProperties: false }),
  create(_options, env) {
    const open = (field: 'train' | 'heldout'): RowSource => {
      const path = env.dataset[field];
      if (path === null) throw new RlstreamError('CONFIG_INVALID', `dataset.${field}: the files task needs a .jsonl or .parquet file of rows`);
      return loaderFor(path, env.dataset.loader, `dataset.${field}`)(path);
    };
    return {
      datasetName: 'dataset',
      trainRows: () => open('train'),
      heldoutRows: (n) => (env.dataset.heldout === null ? Promise.resolve([]) : firstRows(open('heldout'), n)),
    };
  },
});
