// The trainer's data-parallel keys: trainer.devices (how many GPUs, or which) and trainer.data_parallel (gradient
// buckets, their type on the wire, the collective, and what a step with fewer groups than ranks does). Compiled
// here; the machine's GPUs are checked against them in devices.ts, at `config check` and at start.
import { Type } from '@sinclair/typebox';
import { compileValue, ConfigError, oneOf } from '../../../core/config/validate.ts';
import type { CollectiveDtype } from '../../../native/collectives/collective.ts';
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
  /** Whether the ranks are GPUs (trainer.device: cuda), which devices.ts checks against the machine. */
  onGpus: boolean;
  /** How long a step may wait on a rank that neither finishes nor exits before the step fails (ms). */
  stepTimeoutMs: number;
}

/** One rank; buckets of PyTorch DDP's default bucket_cap_mb (25 MiB). */
export const DATA_PARALLEL_DEFAULTS: DataParallelConfig = Object.freeze({ ranks: 1, deviceIds: null, bucketBytes: 25 * 1024 * 1024, dtype: 'fp32', collective: 'nccl', fewerGroups: 'refuse', onGpus: false, stepTimeoutMs: 1_800_000 });
const d = DATA_PARALLEL_DEFAULTS;

export const DevicesSchema = Type.Unsafe<number | number[]>({
  type: ['integer', 'array'],
  minimum: 1,
  items: { type: 'integer', minimum: 0 },
  minItems: 1,
  uniqueItems: true,
  default: d.ranks,
  description:
    "The trainer's data-parallel ranks, one process each: a count (the first N GPUs) or a list of GPU indices as CUDA numbers them (the trainer's own process is rank 0, on the first listed, which must be GPU 0 of what it sees). 1 trains on one device (trainer.device). On trainer.device: cuda, one GPU per rank with NCCL, as many GPUs as the machine has, checked at `config check` and at start; on trainer.device: cpu, N processes with the reference collective (data_parallel.collective: reference). `--nproc N` sets it too (docs/scaling.md).",
});

export const DataParallelSection = Type.Object(
  {
    bucket_bytes: Type.Integer({ minimum: 4, default: d.bucketBytes, description: 'Bytes of one gradient bucket in its reduction type (each bucket is one all-reduce).' }),
    reduce_dtype: oneOf(['fp32', 'bf16'] as const, { default: d.dtype, description: "The gradients' type in the all-reduce: 'bf16' sends half the bytes and keeps 8 bits of mantissa." }),
    collective: oneOf(['nccl', 'reference'] as const, { default: d.collective, description: "'nccl': NCCL loaded by the native core (libnccl.so.2), for GPU ranks; 'reference': the ranks' processes meet in rank 0's, which sums in rank order in fp32 (CPU ranks: trainer.device: cpu)." }),
    fewer_groups: oneOf(['refuse', 'idle'] as const, { default: d.fewerGroups, description: "A step with fewer groups than ranks (a group is never split): 'refuse' fails the step, 'idle' lets the extra ranks add zero gradients." }),
    step_timeout_s: Type.Number({ exclusiveMinimum: 0, default: d.stepTimeoutMs / 1000, description: "How long a step waits on a rank process that neither finishes it nor exits (stopped, or stuck in a collective) before the step fails with nothing committed and the ranks that did not finish are killed; a step's compute and its checkpoint must fit in it (30 minutes, as NCCL watchdogs are commonly set)." }),
  },
  { additionalProperties: false, default: {}, description: 'Data-parallel training over trainer.devices (consumers/trainer/parallel, docs/scaling.md).' },
);

/** trainer.devices and trainer.data_parallel, with the cross-key rules of the section (paths named). */
export function compileDataParallel(devices: number | number[], section: unknown, trainer: { device: string; groupsPerStep: number; klCoef: number }, path = 'trainer'): DataParallelConfig {
  const dp = compileValue(DataParallelSection, section ?? {}, `${path}.data_parallel`);
  const ranks = Array.isArray(devices) ? devices.length : devices;
  const issues = [];
  const onGpus = trainer.device === 'cuda';
  if (ranks > 1 && !onGpus && dp.collective !== 'reference') {
    issues.push({ path: `${path}.devices`, message: `${ranks} ranks on trainer.device: ${trainer.device} need the reference collective (NCCL reduces GPU memory); set trainer.device: cuda (one GPU each), or trainer.data_parallel.collective: reference, or trainer.devices: 1` });
  }
  if (ranks > 1 && onGpus && dp.collective !== 'nccl') {
    issues.push({ path: `${path}.data_parallel.collective`, message: `'${dp.collective}' cannot reach GPU memory; GPU ranks reduce with NCCL: set it to nccl (or trainer.device: cpu)` });
  }
  if (ranks > 1 && trainer.klCoef > 0) {
    issues.push({ path: `${path}.kl_coef`, message: `${trainer.klCoef} needs a reference model on every rank, which the data-parallel step does not hold yet; set it to 0, or trainer.devices: 1` });
  }
  if (Array.isArray(devices) && devices.length > 1 && onGpus && devices[0] !== 0) {
    issues.push({ path: `${path}.devices`, message: `[${devices.join(', ')}] puts rank 0 on GPU ${devices[0]}, but rank 0 is the trainer's own process and trains on the first GPU it sees; list 0 first, or start the run with CUDA_VISIBLE_DEVICES naming the GPUs and list them from 0` });
  }
  if (ranks > 1 && dp.fewer_groups === 'refuse' && trainer.groupsPerStep < ranks) {
    issues.push({ path: `${path}.groups_per_step`, message: `${trainer.groupsPerStep} group(s) per step cannot cover ${ranks} ranks (a group is never split); raise it to at least ${ranks}, or set ${path}.data_parallel.fewer_groups: idle` });
  }
  const bytes = dp.reduce_dtype === 'bf16' ? 2 : 4;
  if (dp.bucket_bytes % bytes !== 0) issues.push({ path: `${path}.data_parallel.bucket_bytes`, message: `${dp.bucket_bytes} is not a whole number of ${dp.reduce_dtype} elements (${bytes} bytes each); use a multiple of ${bytes}` });
  if (issues.length > 0) throw new ConfigError(issues);
  return Object.freeze({ ranks, deviceIds: Array.isArray(devices) ? Object.freeze([...devices]) as number[] : null, bucketBytes: dp.bucket_bytes, dtype: dp.reduce_dtype, collective: dp.collective, fewerGroups: dp.fewer_groups, onGpus, stepTimeoutMs: Math.round(dp.step_timeout_s * 1000) });
}
