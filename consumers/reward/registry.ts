// Reward functions registered by data_source. Registering is one call, `registerReward(dataSource, fn)`, so
// a task (the built-in calculator task, a user's module) adds its reward without touching this file.
import { functionShape, Registry } from '../../core/config/registry.ts';
import { RlstreamError } from '../../core/errors.ts';
import { gsm8kReward } from '../../core/tasks/gsm8k.ts';
import { mathNumericReward } from '../../core/tasks/math-numeric.ts';
import type { RewardFn } from '../../core/tasks/reward-fn.ts';

export class RewardRegistry {
  private readonly fns = new Map<string, RewardFn>();

  register(dataSource: string, fn: RewardFn): this {
    if (typeof fn !== 'function') throw new RlstreamError('CONFIG_INVALID', `reward for data_source "${dataSource}" is not a function`);
    this.fns.set(dataSource, fn);
    return this;
  }

  get(dataSource: string): RewardFn | undefined {
    return this.fns.get(dataSource);
  }

  /** The function for a data_source, or REWARD_FAILED naming what is registered. */
  require(dataSource: string): RewardFn {
    const fn = this.fns.get(dataSource);
    if (!fn) throw new RlstreamError('REWARD_FAILED', `no reward function for data_source "${dataSource}" (registered: ${[...this.fns.keys()].sort().join(', ') || 'none'})`);
    return fn;
  }

  names(): string[] {
    return [...this.fns.keys()].sort();
  }
}

/** The registry the reward consumer uses unless given another: the built-ins, then whatever tasks add. */
export const defaultRewards = new RewardRegistry()
  .register('gsm8k', gsm8kReward())
  .register('openai/gsm8k', gsm8kReward())
  .register('math_numeric', mathNumericReward());

export function registerReward(dataSource: string, fn: RewardFn): void {
  defaultRewards.register(dataSource, fn);
}

/** User reward functions (`reward.module`, `reward.export`), loaded with the errors every plug-in kind gives. */
export const rewardModules = new Registry<RewardFn>('reward function', functionShape('a function (data_source, solution, ground_truth, extra_info) => number | {score, correct?}'));

/** Load a user's reward function: `reward.module` (a path, relative to `baseDir`) and its export name. */
export function loadRewardModule(modulePath: string, exportName = 'default', baseDir = process.cwd(), field = 'reward'): Promise<RewardFn> {
  return rewardModules.load({ module: modulePath, export: exportName }, baseDir, field);
}
