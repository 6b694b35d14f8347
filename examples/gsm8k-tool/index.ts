// The GSM8K tool-agent task as a verl user has it, registered as the task `gsm8k-tool`: rows are verl's
// Parquet as its preprocessing writes them (read unchanged: each row's agent_name picks the agent loop, its
// extra_info.tools_kwargs reach the tool's create step), the tools come from verl's tool YAML, and the reward
// is verl's GSM8K score under the rows' data_source (openai/gsm8k, registered with the built-in rewards).
// The shipped rows (data/) are a few dozen; dataset.train / dataset.heldout point the task at a user's own.
import { dirname, isAbsolute, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Type } from '@sinclair/typebox';
import { extractGsm8kAnswer, gsm8kReward } from '../../core/tasks/gsm8k.ts';
import { loaderFor } from '../../producers/dataset/loaders.ts';
import type { DatasetRow, RowSource } from '../../producers/dataset/types.ts';
import { VERL_GSM8K_DATA_SOURCE } from '../../producers/dataset/verl-gsm8k.ts';
import { registerTask } from '../../producers/tasks.ts';
import type { SftExample } from '../../core/tasks/demonstration.ts';
import type { ChatTokenizer } from '../../producers/tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from '../../producers/tokenizer/delta.ts';
import { loadToolConfig } from '../../producers/tools/config.ts';
import { Gsm8kTool, GSM8K_TOOL_NAME } from '../../producers/tools/gsm8k.ts';
import type { ToolSet } from '../../producers/tools/tool-set.ts';
import { assistantGenerationText } from '../calculator/demos.ts';

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

/**
 * A demonstration of the tool protocol on one row: submit the ground truth with calc_gsm8k_reward, read verl's
 * reply, answer `#### <n>`. It teaches a small model the call's format (what the built-in policy lacks for
 * these prompts); the answers are the rows' own, so held-out accuracy measures nothing from it.
 */
export function toolDemonstration(tok: ChatTokenizer, tools: ToolSet, row: DatasetRow): SftExample {
  const delta = new DeltaTokenizer(tok);
  const gt = row.reward_model.ground_truth;
  const tool = new Gsm8kTool();
  tool.create('demo', { ground_truth: gt });
  const reply = tool.execute('demo', { answer: gt }).text;
  const tokens: number[] = [];
  const responseMask: number[] = [];
  const push = (ids: number[], m: number) => {
    tokens.push(...ids);
    for (let i = 0; i < ids.length; i++) responseMask.push(m);
  };
  push(delta.promptIds(row.prompt, tools.schemas()), 0);
  const call = `<tool_call>\n${JSON.stringify({ name: GSM8K_TOOL_NAME, arguments: { answer: gt } })}\n</tool_call>`;
  push(tok.encode(assistantGenerationText(tok, { role: 'assistant', content: call })), 1);
  push(delta.deltaIds([{ role: 'tool', content: reply, name: GSM8K_TOOL_NAME }], true, tok.eosToken ?? null).ids, 0);
  push(tok.encode(assistantGenerationText(tok, { role: 'assistant', content: `#### ${gt}` })), 1);
  return { tokens, responseMask };
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
      async sftExamples(tok, stage) {
        const rows: DatasetRow[] = [];
        for await (const row of open(train, 'dataset.train')) rows.push(row);
        const tools = await loadToolConfig(toolConfig);
        try {
          return Array.from({ length: stage.problems }, (_, i) => toolDemonstration(tok, tools, rows[i % rows.length]!));
        } finally {
          await tools.close();
        }
      },
    };
  },
});

