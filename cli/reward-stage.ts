// The reward stage a command names with --reward and --config (replay, score): `run` is the run's own stage,
// any other name one function in it. One resolution, so both commands take the same names.
import { loadRunConfig } from './config/run-config.ts';
import { RlstreamError } from '../core/errors.ts';
import { defaultRewards, loadRewardModule } from '../consumers/reward/registry.ts';
import type { RewardStage } from '../consumers/reward/stage.ts';
import type { RewardFn } from '../core/tasks/reward-fn.ts';
import { resolvePlugins, runRewardStage } from './run/plugins.ts';

/**
 * `run` (or no spec with --config): the run's own stage, its reward.name / reward.module, else the task's
 * function for each data source, with its shaping. `path/to/module.ts#export`: a user's function. Otherwise a
 * function registered by data source: the built-ins, and with --config the task's too. With --config the run's
 * shaping applies to the function named; without it, none. `builtin` gives the built-in functions that take the
 * command's own parameters (score's gsm8k --method, --format-score).
 */
export async function rewardStageFor(spec: string | undefined, configPath: string | undefined, builtin?: (name: string) => RewardFn | null): Promise<RewardStage> {
  const config = configPath ? loadRunConfig(configPath) : null;
  const plugins = config ? await resolvePlugins(config) : null;
  if (spec === undefined || spec === 'run') {
    if (!config || !plugins) throw new RlstreamError('CONFIG_INVALID', `${spec === undefined ? 'no --reward' : '--reward run'}: the run's reward stage needs the run's config: --config <config.yaml> (or name a function: --reward <data source>)`);
    return runRewardStage(config, plugins);
  }
  const registry = plugins?.rewards ?? defaultRewards;
  const shaping = config?.reward.shaping ?? {};
  if (spec.includes('#') || /\.(ts|js|mjs)$/.test(spec)) {
    const [path, name] = spec.split('#');
    return { registry, fn: { fn: await loadRewardModule(path!, name ?? 'default'), name: spec }, shaping };
  }
  const fn = builtin?.(spec) ?? registry.get(spec);
  if (!fn) {
    const hint = configPath ? '' : "; a task's own rewards (rlstream/calculator, …) need the run's config: --config <config.yaml>";
    throw new RlstreamError('CONFIG_INVALID', `--reward ${spec}: no reward function for that data source (known: ${registry.names().join(', ')}; or run, the config's own)${hint}`);
  }
  return { registry, fn: { fn, name: spec }, shaping };
}
