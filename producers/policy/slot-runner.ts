// The model-runner interface under the continuous-batching scheduler (native-engine.ts): a KV cache of numbered
// slots, and one call that appends tokens to any set of slots (prefills and one-token decodes mixed) and returns
// each slot's next-token distribution. The native core's Model (CPU and CUDA) is one; the ONNX runner behind
// onnx-slot-runner.ts is another.

export interface SlotRunner {
  readonly config: { readonly vocab_size: number };
  /** `slots` sequences of up to `maxLen` tokens, every slot empty; replaces any previous cache. */
  kvReserve(slots: number, maxLen: number): void;
  /** Keeps the first `length` tokens of a slot (0 frees it). */
  kvTruncate(slot: number, length: number): void;
  /**
   * Appends counts[b] tokens (packed in `tokens`, slot by slot) to slots[b] and returns softmax(logits ×
   * invTemperature[b]) after each slot's last token, [B, V] (into `out` when given). `weights`: the policy version
   * whose weights run the step, for a runner that holds several (dropWeights); others hold one and take none.
   */
  extend(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature?: Float32Array, out?: Float32Array, weights?: number): Promise<Float32Array>;
  /**
   * Optional: extend, then one token per slot drawn where the rows are, by sampler.ts's rule for rows without
   * top-k / top-p (uniforms[b] in [0, 1), a negative one the arg-max). A runner without it has its rows sampled on
   * the host.
   */
  extendSample?(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature: Float32Array, uniforms: Float64Array): Promise<{ tokens: Int32Array; logprobs: Float32Array }>;
  /**
   * Optional: whether the runner still runs at all (one token on an empty cache). The scheduler asks after a
   * failed step, to tell a bad batch (later requests can still be served) from a dead runner (fail them at once).
   * A runner without it is taken to run.
   */
  healthy?(weights?: number): Promise<boolean>;
  /**
   * Optional, for a runner that holds weights of several policy versions at once (rollout.interrupt 'finish'; its
   * owner adds them): releases a version's weights once the scheduler has no turn or session left for them. A
   * runner with it is named the version of every step (extend's `weights`) and samples on the host.
   */
  dropWeights?(version: number): Promise<void>;
}
