// The token-in, token-out contract every LLM backend implements: SGLang, vLLM and the built-in
// onnxruntime policy. Agent loops see only this.
import type { SamplingParams } from '../../schemas/generated/types.ts';

export type FinishReason = 'stop' | 'length' | 'abort';

export interface GenerateRequest {
  /** Unique per call (for cancellation and logs). */
  requestId: string;
  /** The trajectory id: later turns of the same session go to the same server / keep their KV cache. */
  sessionId?: string;
  /** The whole token context of the trajectory so far (prompt and all earlier turns). */
  promptIds: number[];
  sampling: SamplingParams;
  /**
   * Alternatives per generated token (1..LlmBackend.maxTopLogprobs): the most probable tokens of the distribution
   * the token was sampled from, with their log-probs under the same convention as `logprobs`. Absent or 0: none.
   */
  topLogprobs?: number;
}

/** One alternative of a generated token (GenerateResult.topLogprobs). */
export interface TokenAlternative {
  token: number;
  logprob: number;
}

export interface GenerateResult {
  tokenIds: number[];
  /** Log-prob of each sampled token under the policy that sampled it. */
  logprobs: number[];
  finishReason: FinishReason;
  /** Version of the weights that produced the tokens (one per token when a swap happened mid-turn). */
  policyVersions: number[];
  server: string;
  latencyMs: number;
  /** Present when the server returned text only and the ids were re-derived (mismatch: the token counts differed). */
  retokenized?: { mismatch: boolean };
  /** With request.topLogprobs: per token, its alternatives, most probable first (ties by token id). */
  topLogprobs?: TokenAlternative[][];
  /**
   * Leading tokens of tokenIds the policy did not sample (a prefix the caller forced, e.g. the opening of a tool
   * call for tool_choice): recorded with response_mask 0, log-prob 0 and policy version -1. Absent: 0.
   */
  forced?: number;
}

import type { Model } from '../../native/model.ts';

export interface PolicyUpdate {
  version: number;
  /** Local path of the verified safetensors weights (with `adapter`, the adapter file: read it through `adapter`). */
  weightsPath: string;
  configJson: string;
  /**
   * A version published as LoRA adapters (trainer.lora): the verified adapter file and the verified weights it
   * sits on (version 0's). A backend that cannot apply adapters refuses the update (PolicyUpdates.refuseAdapter).
   */
  adapter?: { path: string; baseWeightsPath: string };
}

export interface LlmBackend {
  readonly name: string;
  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult>;
  /** The trajectory is finished: sticky routes and kept KV caches can go. */
  releaseSession?(sessionId: string): void;
  /** A new policy version is available (hot-swap). Backends that cannot load weights ignore it. */
  updatePolicy?(update: PolicyUpdate): Promise<void>;
  /** The most alternatives per token it computes (GenerateRequest.topLogprobs); absent: none. */
  readonly maxTopLogprobs?: number;
  /** Version new requests are generated with. */
  currentPolicyVersion(): number;
  /**
   * Backends whose model runs in this process: seconds so far spent in its forward steps and in loading new
   * versions' weights (how a GPU shared with the trainer divides its time). Servers elsewhere leave it out.
   */
  deviceSeconds?(): { generate: number; loadWeights: number };
  /**
   * Backends whose model runs in this process, or engines on other GPUs of the host: version `version`'s weights
   * in a trainer's model here, offered before the version's update arrives (TrainerDeps.onWeights). A backend on
   * the same device keeps a copy and takes the version from it; engines elsewhere get them by broadcast; others
   * ignore it and read the version's file. It resolves once the transfer is queued behind the model's kernels.
   */
  stageWeights?(version: number, source: Model): void | Promise<void>;
  close(): Promise<void>;
}
