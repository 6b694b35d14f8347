// The GSM8K tool-agent task as a verl user has it, registered as the task `gsm8k-tool`: rows are verl's
// Parquet as its preprocessing writes them (read unchanged: each row's agent_name picks the agent loop, its
// extra_info.tools_kwargs reach the tool's create step), the tools come from verl's tool YAML, and the reward
// is verl's GSM8K score under the rows' data_source (openai/gsm8k, registered with the built-in rewards).
// The shipped rows (data/) are a few dozen; dataset.train / dataset.heldout point the task at a user's own.
import { dirname, isAbsolute, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Type } from '@sinclair/typebox';
import { extractGsm8kAnswer, gsm8kReward } from '../../consumers/reward/gsm8k.ts';
import { loaderFor } from '../../producers/dataset/loaders.ts';
import type { DatasetRow, RowSource } from '../../producers/dataset/types.ts';
import { VERL_GSM8K_DATA_SOURCE } from '../../producers/dataset/verl-gsm8k.ts';
import { registerTask } from '../../producers/tasks.ts';
import { loadToolConfig } from '../../producers/tools/config.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
export const GSM8K_TOOL_DIR = HERE;
export const GSM8K_TOOL_YAML = join(HERE, 'gsm8k_tool_config.yaml');
export const GSM8K_TRAIN = join(HERE, 'data', 'train.parquet');
export const GSM8K_HELDOUT = join(HERE, 'data', 'test.parquet');

// verl's default GSM8K score (verl/utils/reward_score/__init__.py: gsm8k.compute_score with its defaults).
const reward = gsm8kReward({ method: 'strict', formatScore: 0, score: 1 });

async function* firstRows(source: RowSource, n: number): AsyncGenerator<DatasetRow> {
  if (n <= 0) return;
  let i = 0;
  for await (const row of source) {
    yield row;
    if (++i >= n) return;
  }
}

registerTask('gsm8k-tool', {
  options: Type.Object(
    {
      tool_config: Type.String({ minLength: 1, default: GSM8K_TOOL_YAML, description: "verl's tool YAML offered when tools.config is not set (default: the shipped gsm8k_tool_config.yaml)." }),
    },
    { additionalProperties: false },
  ),
  create(options, env) {
    const train = env.dataset.train ?? GSM8K_TRAIN;
    const heldout = env.dataset.heldout ?? GSM8K_HELDOUT;
    const open = (path: string, field: string): RowSource => loaderFor(path, env.dataset.loader, field)(path);
    const toolConfig = isAbsolute(options.tool_config) ? options.tool_config : join(env.baseDir, options.tool_config);
    return {
      datasetName: 'gsm8k',
      trainRows: () => open(train, 'dataset.train'),
      heldoutRows: async (n) => {
        const out: DatasetRow[] = [];
        for await (const row of firstRows(open(heldout, 'dataset.heldout'), n)) out.push(row);
        return out;
      },
      rewards: { [VERL_GSM8K_DATA_SOURCE]: reward },
      tools: () => loadToolConfig(toolConfig, { defaultTimeoutMs: 5_000 }),
      correct: (t) => extractGsm8kAnswer(t.response_text, 'strict') === t.ground_truth,
    };
  },
});

