// The GPUs this process can use (the CUDA runtime's count through the addon where it is built with CUDA, else
// nvidia-smi -L), the name a child process on one of them gets in its CUDA_VISIBLE_DEVICES, and backend.devices
// (rollout engines on GPUs of their own) against them. trainer.devices is checked in consumers/trainer/parallel.
import { spawnSync } from 'node:child_process';
import { ConfigError } from '../core/config/validate.ts';
import { RlstreamError } from '../core/errors.ts';
import { loadedAddon } from './addon.ts';

export interface GpusFound {
  count: number;
  /** How they were counted, for the message. */
  source: string;
}

/**
 * What a child process started on GPU `index` of this process puts in its CUDA_VISIBLE_DEVICES: the index itself,
 * or where this process sees a subset (its own CUDA_VISIBLE_DEVICES), that subset's entry. `field` names the key.
 */
export function visibleDeviceName(index: number, field: string, visible = process.env['CUDA_VISIBLE_DEVICES']): string {
  const names = visible === undefined ? null : visible.split(',').map((s) => s.trim()).filter((s) => s !== '');
  if (names === null) return String(index);
  if (index >= names.length) throw new RlstreamError('CONFIG_INVALID', `${field}: GPU ${index} is not visible to this process (CUDA_VISIBLE_DEVICES=${visible})`);
  return names[index]!;
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
 * Problems of backend.devices (rollout engines on GPUs of their own) on a machine with `found` GPUs: the engines
 * are CUDA engines, on GPUs the machine has, none of them one the trainer of the same process trains on (`trainer`:
 * its data-parallel keys and device; absent where no trainer runs beside the engines).
 */
export function engineDevicesProblems(devices: readonly number[], device: unknown, trainer?: { ranks: number; deviceIds: readonly number[] | null; device: string }, gpus: GpusFound | (() => GpusFound) = gpusFound): string[] {
  const field = 'backend.devices';
  if (device !== 'cuda') return [`${field}: lists GPUs for rollout engines, which are native CUDA engines; set backend.device: cuda, or remove ${field} (the CPU engines run in this process: backend.workers)`];
  const found = typeof gpus === 'function' ? gpus() : gpus;
  const problems: string[] = [];
  for (const id of devices) if (id >= found.count) problems.push(`${field}: GPU ${id} is not one of the ${found.count} GPU(s) found${found.count > 0 ? ` (indices 0 to ${found.count - 1})` : ''}; counted by ${found.source}. List GPUs this machine has, or remove ${field} to generate in the run's process`);
  if (trainer && trainer.device === 'cuda') {
    const trainerGpus = trainer.deviceIds ?? Array.from({ length: trainer.ranks }, (_, i) => i);
    const shared = devices.filter((d) => trainerGpus.includes(d));
    if (shared.length > 0) problems.push(`${field}: GPU ${shared.join(', ')} ${shared.length > 1 ? 'are' : 'is'} also the trainer's (trainer.devices: GPUs ${trainerGpus.join(', ')}); list GPUs the trainer does not use, or remove ${field} to generate on the trainer's GPU in its process`);
  }
  return problems;
}

/** At start: throws CONFIG_INVALID listing every problem of backend.devices on this machine. */
export function checkEngineDevices(devices: readonly number[], device: unknown, gpus: GpusFound | (() => GpusFound) = gpusFound): void {
  const problems = engineDevicesProblems(devices, device, undefined, gpus);
  if (problems.length > 0) throw new ConfigError(problems.map((p) => ({ path: 'backend.devices', message: p.slice('backend.devices: '.length) })));
}
