// trainer.devices against the machine: the GPUs found (the CUDA runtime's count through the addon where it is built
// with CUDA, else nvidia-smi -L), and what a run asking for more, or for data parallelism, meets. The same problems
// are listed by `config check` and thrown at start, so a config the check passes starts.
import { spawnSync } from 'node:child_process';
import { ConfigError } from '../../../core/config/validate.ts';
import { loadedAddon } from '../../../native/addon.ts';
import type { DataParallelConfig } from './options.ts';

export interface GpusFound {
  count: number;
  /** How they were counted, for the message. */
  source: string;
}

/** The GPUs this process can use. */
export function gpusFound(): GpusFound {
  const addon = loadedAddon() as (ReturnType<typeof loadedAddon> & { cudaDeviceCount?: () => number | null }) | null;
  const viaAddon = addon?.cudaDeviceCount?.() ?? null;
  if (viaAddon !== null) return { count: viaAddon, source: "the CUDA runtime's device count (through the native addon)" };
  const smi = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8', timeout: 10_000 });
  if (smi.error || smi.status !== 0) return { count: 0, source: `nvidia-smi -L (${smi.error ? 'not runnable here' : `exit ${smi.status}`}) and an addon built without CUDA` };
  const listed = smi.stdout.split('\n').filter((l) => /^GPU \d+:/.test(l)).length;
  // nvidia-smi lists every GPU; a process sees only those CUDA_VISIBLE_DEVICES names
  const visible = process.env['CUDA_VISIBLE_DEVICES'];
  if (visible !== undefined) {
    const n = visible.trim() === '' ? 0 : visible.split(',').length;
    return { count: Math.min(n, listed), source: `nvidia-smi -L (${listed} listed), of which CUDA_VISIBLE_DEVICES=${visible} leaves ${Math.min(n, listed)}` };
  }
  return { count: listed, source: 'nvidia-smi -L' };
}

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
