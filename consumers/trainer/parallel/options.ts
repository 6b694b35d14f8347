// The trainer's data-parallel keys: trainer.devices (how many GPUs, or which) and trainer.data_parallel (gradient
// buckets, their type on the wire, the collective, and what a step with fewer groups than ranks does). Compiled
// here; the machine's GPUs are checked against them in devices.ts, at `config check` and at start.
import { Type } from '@sinclair/typebox';
import { compileValue, ConfigError, oneOf } from '../../../core/config/validate.ts';
import type { CollectiveDtype } from './collective.ts';
import type { FewerGroups } from './shard.ts';

export interface DataParallelConfig {
  /** Ranks: one per GPU. */
  ranks: number;
  /** The GPUs by index (CUDA's numbering), or null for the first `ranks`. */
  deviceIds: number[] | null;
  bucketBytes: number;
  dtype: CollectiveDtype;
  collective: 'nccl' | 'reference';
  fewerGroups: FewerGroups;
}

/** One rank; buckets of PyTorch DDP's default bucket_cap_mb (25 MiB). */
export const DATA_PARALLEL_DEFAULTS: DataParallelConfig = Object.freeze({ ranks: 1, deviceIds: null, bucketBytes: 25 * 1024 * 1024, dtype: 'fp32', collective: 'nccl', fewerGroups: 'refuse' });
const d = DATA_PARALLEL_DEFAULTS;

export const DevicesSchema = Type.Unsafe<number | number[]>({
  type: ['integer', 'array'],
  minimum: 1,
  items: { type: 'integer', minimum: 0 },
  minItems: 1,
  uniqueItems: true,
  default: d.ranks,
  description:
    "The trainer's GPUs, one data-parallel rank each: a count (the first N GPUs) or a list of GPU indices as CUDA numbers them. 1 trains on one device (trainer.device). More than one needs trainer.device: cuda and as many GPUs on the machine, checked at `config check` and at start (`--nproc N` sets it too); for now more than one is refused, since `rlstream run` does not start data-parallel ranks yet (docs/scaling.md).",
});

export const DataParallelSection = Type.Object(
  {
    bucket_bytes: Type.Integer({ minimum: 4, default: d.bucketBytes, description: 'Bytes of one gradient bucket in its reduction type (each bucket is one all-reduce).' }),
    reduce_dtype: oneOf(['fp32', 'bf16'] as const, { default: d.dtype, description: "The gradients' type in the all-reduce: 'bf16' sends half the bytes and keeps 8 bits of mantissa." }),
    collective: oneOf(['nccl', 'reference'] as const, { default: d.collective, description: "'nccl': NCCL loaded by the native core (libnccl.so.2); 'reference': the in-process reference the CPU tests use." }),
    fewer_groups: oneOf(['refuse', 'idle'] as const, { default: d.fewerGroups, description: "A step with fewer groups than ranks (a group is never split): 'refuse' fails the step, 'idle' lets the extra ranks add zero gradients." }),
  },
  { additionalProperties: false, default: {}, description: 'Data-parallel training over trainer.devices (consumers/trainer/parallel, docs/scaling.md).' },
);

/** trainer.devices and trainer.data_parallel, with the cross-key rules of the section (paths named). */
export function compileDataParallel(devices: number | number[], section: unknown, trainer: { device: string; groupsPerStep: number }, path = 'trainer'): DataParallelConfig {
  const dp = compileValue(DataParallelSection, section ?? {}, `${path}.data_parallel`);
  const ranks = Array.isArray(devices) ? devices.length : devices;
  const issues = [];
  if (ranks > 1 && trainer.device !== 'cuda') issues.push({ path: `${path}.devices`, message: `${ranks} ranks need trainer.device: cuda (one GPU each); set trainer.device: cuda, or trainer.devices: 1` });
  if (ranks > 1 && dp.fewer_groups === 'refuse' && trainer.groupsPerStep < ranks) {
    issues.push({ path: `${path}.groups_per_step`, message: `${trainer.groupsPerStep} group(s) per step cannot cover ${ranks} ranks (a group is never split); raise it to at least ${ranks}, or set ${path}.data_parallel.fewer_groups: idle` });
  }
  const bytes = dp.reduce_dtype === 'bf16' ? 2 : 4;
  if (dp.bucket_bytes % bytes !== 0) issues.push({ path: `${path}.data_parallel.bucket_bytes`, message: `${dp.bucket_bytes} is not a whole number of ${dp.reduce_dtype} elements (${bytes} bytes each); use a multiple of ${bytes}` });
  if (issues.length > 0) throw new ConfigError(issues);
  return Object.freeze({ ranks, deviceIds: Array.isArray(devices) ? Object.freeze([...devices]) as number[] : null, bucketBytes: dp.bucket_bytes, dtype: dp.reduce_dtype, collective: dp.collective, fewerGroups: dp.fewer_groups });
}
