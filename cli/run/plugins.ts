// The plug-ins a run's config names, resolved once at start-up, before any role starts: the task (registered
// or user code, its own options checked), the reward function (registered or user code), and the user's
// agent loops and interactions. A missing module, export or registered name fails here, naming the config path.
import { Type } from '@sinclair/typebox';
import type { RunConfig } from '../config/run-config.ts';
import type { Registry } from '../../core/config/registry.ts';
import { compileValue } from '../../core/config/validate.ts';
import { RlstreamError } from '../../core/errors.ts';
import { defaultRewards, loadRewardModule, RewardRegistry } from '../../consumers/reward/registry.ts';
import { advantageStage, type AdvantageStage } from '../../consumers/advantage/stage.ts';
import type { RewardStage } from '../../consumers/reward/stage.ts';
import type { RewardFn } from '../../core/tasks/reward-fn.ts';
import { interactionRegistry, interactions as registeredInteractions, type Interaction } from '../../producers/agent/interaction.ts';
import { loadInteractionConfig } from '../../producers/agent/interaction-config.ts';
import { agentLoops } from '../../producers/agent/registry.ts';
import type { AgentLoop } from '../../producers/agent/types.ts';
import { tasks, type Task } from '../../producers/tasks.ts';

export interface RunPlugins {
  task: Task;
  /** Reward functions by data_source: the built-ins and the task's. */
  rewards: RewardRegistry;
  /** One reward function for every row (reward.name or reward.module), or null: by data_source. */
  rewardFn: RewardFn | null;
  /** Its name in RewardInfo.reward_fn: reward.name, or "custom" for a module. */
  rewardFnName: string;
  agents: Registry<AgentLoop>;
  interactions: Registry<Interaction>;
}

export async function resolvePlugins(config: RunConfig): Promise<RunPlugins> {
  const t = config.task;
  let task: Task;
  if (t.module !== null) {
    const plugin = await tasks.load({ module: t.module, ...(t.export ? { export: t.export } : {}) }, config.baseDir, 'task');
    const options = compileValue(Type.Object(plugin.options.properties, { additionalProperties: false }), t.options, 'task');
    task = plugin.create(options, { seed: config.run.seed, baseDir: config.baseDir, dataset: config.dataset });
  } else task = tasks.get(t.name, 'task.name').create(t.options, { seed: config.run.seed, baseDir: config.baseDir, dataset: config.dataset });

  const rewards = new RewardRegistry();
  for (const name of defaultRewards.names()) rewards.register(name, defaultRewards.require(name));
  for (const [dataSource, fn] of Object.entries(task.rewards ?? {})) rewards.register(dataSource, fn);
  const r = config.reward;
  let rewardFn: RewardFn | null = null;
  if (r.module !== null) rewardFn = await loadRewardModule(r.module, r.export ?? 'default', config.baseDir);
  else if (r.name !== null) {
    const fn = rewards.get(r.name);
    if (!fn) throw new RlstreamError('CONFIG_INVALID', `reward.name: unknown reward function "${r.name}" (known: ${rewards.names().join(', ')})`);
    rewardFn = fn;
  }

  const agents = agentLoops.copy();
  for (const [name, ref] of Object.entries(config.rollout.agentLoops)) agents.register(name, await agentLoops.load(ref, config.baseDir, `rollout.agent_loops.${name}`));
  if (!agents.has(config.rollout.defaultAgent)) throw new RlstreamError('CONFIG_INVALID', `rollout.default_agent: unknown agent loop "${config.rollout.defaultAgent}" (known: ${agents.names().join(', ')})`);
  // verl's interaction YAML is the whole set, as in verl: it replaces the built-ins.
  const interactions = config.interaction.config === null ? registeredInteractions.copy() : interactionRegistry();
  if (config.interaction.config !== null) for (const [name, i] of await loadInteractionConfig(config.interaction.config)) interactions.register(name, i);
  for (const [name, ref] of Object.entries(config.rollout.interactions)) interactions.register(name, await registeredInteractions.load(ref, config.baseDir, `rollout.interactions.${name}`));
  return { task, rewards, rewardFn, rewardFnName: r.name ?? 'custom', agents, interactions };
}

/** The run's reward stage (see consumers/reward/stage.ts): what its reward consumer scores with, and a replay of it. */
export function runRewardStage(config: RunConfig, plugins: Pick<RunPlugins, 'rewards' | 'rewardFn' | 'rewardFnName'>): RewardStage {
  return { registry: plugins.rewards, fn: plugins.rewardFn ? { fn: plugins.rewardFn, name: plugins.rewardFnName } : null, shaping: config.reward.shaping };
}

/** The run's advantage stage (see consumers/advantage/stage.ts); `estimator` replaces advantage.estimator. */
export function runAdvantageStage(advantage: RunConfig['advantage'], estimator = advantage.estimator): AdvantageStage {
  return advantageStage({ estimator, options: advantage.options[estimator], dynamicSampling: advantage.dynamicSampling });
}
