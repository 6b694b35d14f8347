// SGLang's native `/generate` endpoint, token in / token out: the request carries `input_ids`,
// `sampling_params` and `return_logprob: true`; the sampled tokens and their log-probs come back in
// `meta_info.output_token_logprobs` as [logprob, token_id, text|null] triples, and
// `meta_info.finish_reason` is {type: "stop" | "length" | "abort", matched?}.
//
// A version published as LoRA adapters (trainer.lora) is loaded through SGLang's `POST /load_lora_adapter
// {lora_name, lora_path}` (a server started with --enable-lora) from the version's PEFT adapter directory; requests
// then carry `lora_path: <name>`, and the previous version's adapter is unloaded (`POST /unload_lora_adapter`).
import { RlstreamError } from '../../core/errors.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { badResponse, finishReasonOf, getOk, postJson, type InferenceServer, type ServerOutput } from './http.ts';
import { adapterName, pruneVersionModelDirs, versionAdapterDir, versionModelDir } from './model-dir.ts';
import type { FinishReason, GenerateRequest, PolicyUpdate } from './types.ts';

export interface SglangServerOptions {
  /** Per-request timeout (default 600 000 ms: long generations are normal). */
  requestTimeoutMs?: number;
  healthTimeoutMs?: number;
  /** How new weights reach the server: 'none' (default) or SGLang's /update_weights_from_disk. */
  weightSync?: 'none' | 'update_weights_from_disk';
}

function sglangSamplingParams(s: SamplingParams, maxNewTokens: number): Record<string, unknown> {
  const p: Record<string, unknown> = {
    temperature: s.temperature,
    top_p: s.top_p,
    // SGLang disables top-k with -1; the contract uses 0.
    top_k: s.top_k > 0 ? s.top_k : -1,
    max_new_tokens: maxNewTokens,
    stop_token_ids: s.stop_token_ids,
    skip_special_tokens: false,
    no_stop_trim: true,
  };
  if (s.seed !== null) p['sampling_seed'] = s.seed;
  return p;
}

function finishReason(fr: unknown): FinishReason {
  return finishReasonOf(fr !== null && typeof fr === 'object' ? (fr as { type?: unknown }).type : fr);
}

export class SglangServer implements InferenceServer {
  private readonly url: string;
  /** The adapter requests name (lora_path), once a version published as adapters is loaded. */
  private lora: string | null = null;

  constructor(
    readonly address: string,
    private readonly options: SglangServerOptions = {},
  ) {
    this.url = address.replace(/\/+$/, '');
  }

  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<ServerOutput> {
    const endpoint = `${this.url}/generate`;
    const body = {
      rid: request.requestId,
      input_ids: request.promptIds,
      sampling_params: sglangSamplingParams(request.sampling, request.sampling.max_new_tokens),
      return_logprob: true,
      logprob_start_len: -1,
      stream: false,
      ...(this.lora !== null ? { lora_path: this.lora } : {}),
    };
    const res = (await postJson(endpoint, body, { signal, timeoutMs: this.options.requestTimeoutMs ?? 600_000 })) as Record<string, unknown>;
    const meta = res['meta_info'] as Record<string, unknown> | undefined;
    if (!meta || typeof meta !== 'object') throw badResponse(endpoint, 'no meta_info');
    const triples = meta['output_token_logprobs'];
    if (!Array.isArray(triples)) throw badResponse(endpoint, 'no meta_info.output_token_logprobs (was return_logprob honoured?)');
    const tokenIds: number[] = [];
    const logprobs: number[] = [];
    for (const t of triples) {
      if (!Array.isArray(t) || typeof t[1] !== 'number') throw badResponse(endpoint, 'output_token_logprobs entry is not [logprob, token_id, text]');
      tokenIds.push(t[1]);
      logprobs.push(typeof t[0] === 'number' ? t[0] : 0);
    }
    const outputIds = res['output_ids'];
    if (Array.isArray(outputIds) && outputIds.length === tokenIds.length && outputIds.some((id, i) => id !== tokenIds[i])) {
      throw badResponse(endpoint, 'output_ids disagree with output_token_logprobs');
    }
    return { tokenIds, logprobs, finishReason: finishReason(meta['finish_reason']) };
  }

  health(signal?: AbortSignal): Promise<boolean> {
    return getOk(`${this.url}/health`, this.options.healthTimeoutMs ?? 5_000, signal);
  }

  async updateWeights(update: PolicyUpdate): Promise<void> {
    if ((this.options.weightSync ?? 'none') === 'none') return;
    if (update.adapter) {
      const name = adapterName(update.version);
      const res = (await postJson(`${this.url}/load_lora_adapter`, { lora_name: name, lora_path: await versionAdapterDir(update) }, { timeoutMs: 600_000 })) as { success?: unknown; error_message?: unknown } | null;
      if (res?.success === false) throw new RlstreamError('BACKEND_BAD_REQUEST', `SGLang load_lora_adapter of policy version ${update.version} on ${this.address}: ${String(res.error_message)} (start SGLang with --enable-lora)`);
      const previous = this.lora;
      this.lora = name;
      // (a failed unload leaves an idle adapter on the server, not a wrong one: the version stands)
      if (previous !== null && previous !== name) await postJson(`${this.url}/unload_lora_adapter`, { lora_name: previous }, { timeoutMs: 600_000 }).catch(() => undefined);
    } else {
      await postJson(`${this.url}/update_weights_from_disk`, { model_path: await versionModelDir(update) }, { timeoutMs: 600_000 });
      this.lora = null;
    }
    await pruneVersionModelDirs(update);
  }
}
