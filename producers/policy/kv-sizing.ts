// How many KV-cache slots the built-in policy gets: on a GPU (kvCacheSlots) and on the CPU (cpuKvSlots, at the end). On a GPU the policy may hold `utilization` of the card (vLLM's
// gpu_memory_utilization, the knob verl users set for colocated rollouts): its weights, a step's activations, the
// device copy of a trainer's newest weights where a trainer in the same process hands them over that way, and the
// KV cache, which gets the rest of that share. The share is never taken past what is free once the weights
// are loaded (a trainer in the same process, or another process, may hold the remainder), and never past
// max_batch slots. Slots are whole sequences of max_len tokens, so the cache is sized in slots.
import { RlstreamError } from '../../core/errors.ts';

export interface KvSizingInput {
  /** The GPU's memory and what was free before and after the policy's model loaded (cudaMemGetInfo). */
  totalBytes: number;
  freeBeforeBytes: number;
  freeAfterBytes: number;
  /** backend.gpu_memory_utilization. */
  utilization: number;
  /**
   * A trainer in this process stages its newest weights on the device for the policy (NativePolicyBackend's
   * stageWeights): a second copy of the policy's weights, allocated at the first version, so it is planned here.
   */
  trainerCopy: boolean;
  /** Activations of the largest step the engine takes (a full prefill plus a decode row per slot). */
  stepBytes: number;
  /** One slot: K and V of every layer for max_len tokens. */
  slotBytes: number;
  maxBatch: number;
  maxLen: number;
}

export interface KvSizing {
  slots: number;
  /** What the KV cache could take: the smaller of the share left after weights and step, and what is free. */
  budgetBytes: number;
  weightsBytes: number;
  /** The staged copy of a trainer's weights planned for (0 without one). */
  stagingBytes: number;
}

const GiB = 1024 ** 3;
const gib = (n: number): string => `${(n / GiB).toFixed(2)} GiB`;

export function kvCacheSlots(i: KvSizingInput): KvSizing {
  const weightsBytes = Math.max(0, i.freeBeforeBytes - i.freeAfterBytes);
  const stagingBytes = i.trainerCopy ? weightsBytes : 0;
  const share = i.utilization * i.totalBytes - weightsBytes - stagingBytes - i.stepBytes;
  const budgetBytes = Math.max(0, Math.min(share, i.freeAfterBytes - stagingBytes - i.stepBytes));
  const slots = Math.min(i.maxBatch, Math.floor(budgetBytes / i.slotBytes));
  if (slots < 1)
    throw new RlstreamError(
      'CONFIG_INVALID',
      `backend.gpu_memory_utilization ${i.utilization}: the built-in policy may take ${gib(i.utilization * i.totalBytes)} of this GPU (${gib(i.totalBytes)}, ${gib(i.freeAfterBytes)} free after its weights loaded); ` +
        `its weights (${gib(weightsBytes)}), ${stagingBytes > 0 ? `the copy of the trainer's weights it stages (${gib(stagingBytes)}), ` : ''}and a step's activations (${gib(i.stepBytes)}) leave ${gib(budgetBytes)} for the KV cache, less than one sequence of backend.max_len ${i.maxLen} tokens (${gib(i.slotBytes)}). ` +
        'Raise backend.gpu_memory_utilization, lower backend.max_len, or free memory on the GPU.',
    );
  return { slots, budgetBytes, weightsBytes, stagingBytes };
}

/**
 * The KV cache of the built-in policy on the CPU, in slots: max_batch for the running turns plus the idle sessions
 * kept for their next turn that backend.kv_cache_bytes buys, each slot counted at max_len tokens (what it may come
 * to hold), so the kept sessions' K/V never exceed kv_cache_bytes. 0 keeps no session beyond the running slots.
 */
export function cpuKvSlots(i: { kvCacheBytes: number; slotBytes: number; maxBatch: number }): { slots: number; keptSessions: number } {
  if (!Number.isInteger(i.kvCacheBytes) || i.kvCacheBytes < 0) throw new RlstreamError('CONFIG_INVALID', `backend.kv_cache_bytes must be a non-negative integer, got ${i.kvCacheBytes}`);
  const keptSessions = Math.floor(i.kvCacheBytes / i.slotBytes);
  return { slots: i.maxBatch + keptSessions, keptSessions };
}
