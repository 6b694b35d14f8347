// vLLM's OpenAI-compatible `/v1/completions` with a token-id prompt (`prompt` as a list of ints),
// `logprobs` and `return_tokens_as_token_ids: true`, so every sampled token comes back as "token_id:N"
// in `choices[0].logprobs.tokens` next to its log-prob in `token_logprobs`. Newer servers also return
// `choices[0].token_ids` (with `return_token_ids`); when present it must agree.
//
// Weight sync (`weightSync: 'reload_weights'`) uses the development endpoints a server started with
// VLLM_SERVER_DEV_MODE=1 serves, as vLLM's sleep-mode docs (docs/features/sleep_mode.md) reload weights in
// place: `POST /collective_rpc {"method": "update_config"}` points every worker's model config at the new
// version's directory (the worker method vLLM's skip_loading_weights_in_engine_init example calls), `POST
// /collective_rpc {"method": "reload_weights"}` loads its safetensors into the running model, then `POST
// /reset_prefix_cache` drops the KV blocks cached under the old weights so no later prompt reuses them.
//
// A version published as LoRA adapters (trainer.lora) goes to vLLM's LoRA endpoints instead (a server started with
// --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): `POST /v1/load_lora_adapter {lora_name, lora_path}`
// with the version's PEFT adapter directory, then requests name the adapter as their `model`, and the previous
// version's adapter is unloaded (`POST /v1/unload_lora_adapter`). The base weights are version 0's, loaded as above.
import { RlstreamError } from '../../core/errors.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { badResponse, Completions, finishReasonOf, getOk, postJson, type InferenceServer, type ServerOutput } from './http.ts';
import { adapterName, pruneVersionModelDirs, versionAdapterDir, versionModelDir } from './model-dir.ts';
import { openAiCompletionBody } from './openai.ts';
import type { GenerateRequest, PolicyUpdate } from './types.ts';

export interface VllmServerOptions {
  /** The served model name; default: the first id of GET /v1/models, asked once. */
  model?: string;
  requestTimeoutMs?: number;
  healthTimeoutMs?: number;
  /** How new weights reach the server: 'none' (default) or vLLM's in-place reload_weights. */
  weightSync?: 'none' | 'reload_weights';
  /** Timeout of each weight-sync request (default 600 000 ms: loading a large model takes minutes). */
  weightSyncTimeoutMs?: number;
}

/** The requests, in order, that load the model directory `modelDir` into a running vLLM server. */
function vllmReloadRequests(modelDir: string): { path: string; body?: Record<string, unknown> }[] {
  return [
    { path: '/collective_rpc', body: { method: 'update_config', args: [{ model_config: { model: modelDir } }] } },
    { path: '/collective_rpc', body: { method: 'reload_weights' } },
    { path: '/reset_prefix_cache' },
  ];
}

/** The OpenAI completion body with vLLM's own fields: token ids in the answer, special tokens kept, top_k -1 = off. */
function vllmCompletionBody(model: string, promptIds: number[], s: SamplingParams): Record<string, unknown> {
  return openAiCompletionBody(model, promptIds, s, { top_k: s.top_k > 0 ? s.top_k : -1, return_token_ids: true, skip_special_tokens: false });
}

function parseTokenId(endpoint: string, tok: unknown): number {
  const m = typeof tok === 'string' ? /^token_id:(\d+)$/.exec(tok) : null;
  if (!m) throw badResponse(endpoint, `token ${JSON.stringify(tok)} is not "token_id:N" (was return_tokens_as_token_ids honoured?)`);
  return Number(m[1]);
}

export class VllmServer implements InferenceServer {
  private readonly api: Completions;
  /** The adapter requests name as their model, once a version published as adapters is loaded. */
  private lora: string | null = null;

  constructor(
    readonly address: string,
    private readonly options: VllmServerOptions = {},
  ) {
    this.api = new Completions(address, options.model);
  }

  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<ServerOutput> {
    const { endpoint, choice } = await this.api.firstChoice<Record<string, unknown>>(
      (model) => vllmCompletionBody(this.lora ?? model, request.promptIds, request.sampling),
      { signal, timeoutMs: this.options.requestTimeoutMs ?? 600_000 },
    );
    const lp = choice['logprobs'] as { tokens?: unknown[]; token_logprobs?: (number | null)[] } | null | undefined;
    if (!lp || !Array.isArray(lp.tokens) || !Array.isArray(lp.token_logprobs)) throw badResponse(endpoint, 'no choices[0].logprobs.tokens / token_logprobs');
    const tokenIds = lp.tokens.map((t) => parseTokenId(endpoint, t));
    const logprobs = lp.token_logprobs.map((x) => (typeof x === 'number' ? x : 0));
    if (logprobs.length !== tokenIds.length) throw badResponse(endpoint, 'tokens and token_logprobs differ in length');
    const ids = choice['token_ids'];
    if (Array.isArray(ids) && (ids.length !== tokenIds.length || ids.some((id, i) => id !== tokenIds[i]))) throw badResponse(endpoint, 'token_ids disagree with logprobs.tokens');
    return { tokenIds, logprobs, finishReason: finishReasonOf(choice['finish_reason']) };
  }

  health(signal?: AbortSignal): Promise<boolean> {
    return getOk(`${this.api.url}/health`, this.options.healthTimeoutMs ?? 5_000, signal);
  }

  async updateWeights(update: PolicyUpdate): Promise<void> {
    if ((this.options.weightSync ?? 'none') === 'none') return;
    if (update.adapter) return this.loadAdapter(update);
    const dir = await versionModelDir(update);
    for (const r of vllmReloadRequests(dir)) {
      try {
        await postJson(`${this.api.url}${r.path}`, r.body, { timeoutMs: this.options.weightSyncTimeoutMs ?? 600_000, emptyOk: true });
      } catch (err) {
        // A 404 here is a server without the development endpoints: say which switch turns them on.
        const hint = /HTTP 404/.test((err as Error).message) ? ' (start vLLM with VLLM_SERVER_DEV_MODE=1 for /collective_rpc and /reset_prefix_cache)' : '';
        throw new RlstreamError(err instanceof RlstreamError ? err.code : 'BACKEND_UNAVAILABLE', `vLLM reload_weights of policy version ${update.version} on ${this.address} failed at ${r.path}: ${(err as Error).message}${hint}`, { cause: err });
      }
    }
    this.lora = null; // whole weights: requests go to the served model again
    await pruneVersionModelDirs(update);
  }

  private async loadAdapter(update: PolicyUpdate): Promise<void> {
    const name = adapterName(update.version);
    const timeoutMs = this.options.weightSyncTimeoutMs ?? 600_000;
    try {
      await postJson(`${this.api.url}/v1/load_lora_adapter`, { lora_name: name, lora_path: await versionAdapterDir(update) }, { timeoutMs, emptyOk: true, textOk: true });
    } catch (err) {
      const hint = /HTTP 404/.test((err as Error).message) ? ' (start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)' : '';
      throw new RlstreamError(err instanceof RlstreamError ? err.code : 'BACKEND_UNAVAILABLE', `vLLM load_lora_adapter of policy version ${update.version} on ${this.address} failed: ${(err as Error).message}${hint}`, { cause: err });
    }
    const previous = this.lora;
    this.lora = name;
    // The new version serves from here on; a failed unload leaves only an idle adapter on the server (vLLM's
    // max_loras then bounds how many), so it does not fail the version.
    if (previous !== null && previous !== name) await postJson(`${this.api.url}/v1/unload_lora_adapter`, { lora_name: previous }, { timeoutMs, emptyOk: true, textOk: true }).catch(() => undefined);
    await pruneVersionModelDirs(update);
  }
}
