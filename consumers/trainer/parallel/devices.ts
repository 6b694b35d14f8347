// trainer.devices against the machine's GPUs (native/gpus.ts), and what a run asking for more, or for data
// parallelism, meets. The same problems are listed by `config check` and thrown at start, so a config the check
// passes starts.
import { ConfigError } from '../../../core/config/validate.ts';
import { gpusFound, type GpusFound } from '../../../native/gpus.ts';
import type { DataParallelConfig } from './options.ts';

/**
 * Problems of trainer.devices on a machine with `found` GPUs, each naming the field, the count found and the fix.
 * CPU ranks (trainer.device: cpu, the reference collective) ask nothing of the GPUs.
 */
export function devicesProblems(dp: DataParallelConfig, gpus: GpusFound | (() => GpusFound) = gpusFound, field = 'trainer.devices'): string[] {
  // the default asks nothing of the machine (no nvidia-smi spawned)
  if (dp.ranks === 1 && dp.deviceIds === null) return [];
  if (dp.ranks > 1 && !dp.onGpus) return [];
  const found = typeof gpus === 'function' ? gpus() : gpus;
  const problems: string[] = [];
  if (dp.ranks > found.count) problems.push(`${field}: asks for ${dp.ranks} GPU(s); this machine has ${found.count} (counted by ${found.source}). Set ${field} to at most ${Math.max(1, found.count)}${found.count === 0 ? ' and trainer.device: cpu' : ''}`);
  for (const id of dp.deviceIds ?? []) if (id >= found.count) problems.push(`${field}: GPU ${id} is not one of the ${found.count} GPU(s) found (indices 0 to ${found.count - 1}; counted by ${found.source})`);
  if (dp.ranks === 1 && dp.deviceIds !== null && dp.deviceIds[0] !== 0 && dp.deviceIds[0]! < found.count) {
    problems.push(`${field}: [${dp.deviceIds[0]}] selects GPU ${dp.deviceIds[0]}, but the trainer trains on the first GPU it sees; start the run with CUDA_VISIBLE_DEVICES=${dp.deviceIds[0]} and set ${field}: 1`);
  }
  return problems;
}

/** At start: throws CONFIG_INVALID listing every problem of trainer.devices on this machine. */
export function checkTrainerDevices(dp: DataParallelConfig, gpus: GpusFound | (() => GpusFound) = gpusFound, field = 'trainer.devices'): void {
  const problems = devicesProblems(dp, gpus, field);
  if (problems.length > 0) throw new ConfigError(problems.map((p) => ({ path: field, message: p.slice(field.length + 2) })));
}
