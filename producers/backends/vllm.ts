// vLLM's OpenAI-compatible `/v1/completions` with a token-id prompt (`prompt` as a list of ints),
// `logprobs` and `return_tokens_as_token_ids: true`, so every sampled token comes back as "token_id:N"
// in `choices[0].logprobs.tokens` next to its log-prob in `token_logprobs`. Newer servers also return
// `choices[0].token_ids` (with `return_token_ids`); when present it must agree.
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { badResponse, getOk, postJson, ServedModel, type InferenceServer, type ServerOutput } from './http.ts';
import type { FinishReason, GenerateRequest } from './types.ts';

export interface VllmServerOptions {
  /** The served model name; default: the first id of GET /v1/models, asked once. */
  model?: string;
  requestTimeoutMs?: number;
  healthTimeoutMs?: number;
}

export function vllmCompletionBody(model: string, promptIds: number[], s: SamplingParams): Record<string, unknown> {
  const body: Record<string, unknown> = {
    model,
    prompt: promptIds,
    max_tokens: s.max_new_tokens,
    temperature: s.temperature,
    top_p: s.top_p,
    top_k: s.top_k > 0 ? s.top_k : -1,
    logprobs: 1,
    return_tokens_as_token_ids: true,
    return_token_ids: true,
    skip_special_tokens: false,
    stop_token_ids: s.stop_token_ids,
    stream: false,
  };
  if (s.seed !== null) body['seed'] = s.seed;
  return body;
}

function parseTokenId(endpoint: string, tok: unknown): number {
  const m = typeof tok === 'string' ? /^token_id:(\d+)$/.exec(tok) : null;
  if (!m) throw badResponse(endpoint, `token ${JSON.stringify(tok)} is not "token_id:N" (was return_tokens_as_token_ids honoured?)`);
  return Number(m[1]);
}

export class VllmServer implements InferenceServer {
  private readonly url: string;
  private readonly model: ServedModel;

  constructor(
    readonly address: string,
    private readonly options: VllmServerOptions = {},
  ) {
    this.url = address.replace(/\/+$/, '');
    this.model = new ServedModel(this.url, options.model);
  }

  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<ServerOutput> {
    const endpoint = `${this.url}/v1/completions`;
    const model = await this.model.get(signal);
    const res = (await postJson(endpoint, vllmCompletionBody(model, request.promptIds, request.sampling), { signal, timeoutMs: this.options.requestTimeoutMs ?? 600_000 })) as Record<string, unknown>;
    const choice = (res['choices'] as Record<string, unknown>[] | undefined)?.[0];
    if (!choice) throw badResponse(endpoint, 'no choices');
    const lp = choice['logprobs'] as { tokens?: unknown[]; token_logprobs?: (number | null)[] } | null | undefined;
    if (!lp || !Array.isArray(lp.tokens) || !Array.isArray(lp.token_logprobs)) throw badResponse(endpoint, 'no choices[0].logprobs.tokens / token_logprobs');
    const tokenIds = lp.tokens.map((t) => parseTokenId(endpoint, t));
    const logprobs = lp.token_logprobs.map((x) => (typeof x === 'number' ? x : 0));
    if (logprobs.length !== tokenIds.length) throw badResponse(endpoint, 'tokens and token_logprobs differ in length');
    const ids = choice['token_ids'];
    if (Array.isArray(ids) && (ids.length !== tokenIds.length || ids.some((id, i) => id !== tokenIds[i]))) throw badResponse(endpoint, 'token_ids disagree with logprobs.tokens');
    const fr = choice['finish_reason'];
    const finishReason: FinishReason = fr === 'length' ? 'length' : fr === 'abort' ? 'abort' : 'stop';
    return { tokenIds, logprobs, finishReason };
  }

  health(signal?: AbortSignal): Promise<boolean> {
    return getOk(`${this.url}/health`, this.options.healthTimeoutMs ?? 5_000, signal);
  }
}
