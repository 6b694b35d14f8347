// JSON over HTTP for inference servers, with errors classified once: connection failures, timeouts and
// 5xx are BACKEND_UNAVAILABLE (retriable: another try or another server may work), 4xx and unparseable
// bodies are BACKEND_BAD_REQUEST (retrying the same request cannot help).
import { RlstreamError } from '../../core/errors.ts';
import type { FinishReason, GenerateRequest, PolicyUpdate, TokenAlternative } from './types.ts';

/** One inference server: what the server manager routes between. */
export interface InferenceServer {
  /** Base URL, also the `server` field of results. */
  readonly address: string;
  generate(request: GenerateRequest, signal?: AbortSignal): Promise<ServerOutput>;
  /** True when the server answers its health endpoint. */
  health(signal?: AbortSignal): Promise<boolean>;
  /** Load new weights, where the server supports it. */
  updateWeights?(update: PolicyUpdate): Promise<void>;
  /** The most alternatives per token it returns (GenerateRequest.topLogprobs); absent: none. */
  readonly maxTopLogprobs?: number;
}

export interface ServerOutput {
  tokenIds: number[];
  logprobs: number[];
  finishReason: FinishReason;
  /** Present when the server returned no token ids and they were re-derived from its text. */
  retokenized?: { mismatch: boolean };
  /** With request.topLogprobs: per token, its alternatives as the server returned them. */
  topLogprobs?: TokenAlternative[][];
  /**
   * Per token, the policy version that sampled it, where the server knows (an engine that swaps weights mid-turn);
   * absent: the version the manager last loaded on the server, for every token.
   */
  policyVersions?: number[];
}

/**
 * POST a JSON body and parse the JSON answer; `emptyOk`: an empty 2xx body (control endpoints answer so) is `null`;
 * `textOk`: a 2xx body that is not JSON is returned as its text (vLLM's LoRA endpoints answer in plain text).
 */
export async function postJson(url: string, body: unknown, options: { signal?: AbortSignal; timeoutMs?: number; headers?: Record<string, string>; emptyOk?: boolean; textOk?: boolean } = {}): Promise<unknown> {
  const signals = [options.signal, options.timeoutMs ? AbortSignal.timeout(options.timeoutMs) : undefined].filter((s): s is AbortSignal => s !== undefined);
  let res: Response;
  try {
    res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...options.headers },
      body: JSON.stringify(body),
      signal: signals.length > 0 ? AbortSignal.any(signals) : undefined,
    });
  } catch (cause) {
    if (options.signal?.aborted) throw options.signal.reason instanceof Error ? options.signal.reason : new RlstreamError('BACKEND_UNAVAILABLE', `request to ${url} aborted`, { cause, retriable: false });
    throw new RlstreamError('BACKEND_UNAVAILABLE', `${url}: ${(cause as Error).name === 'TimeoutError' ? 'timed out' : `connection failed (${describeCause(cause)})`}`, { cause });
  }
  const text = await res.text().catch(() => '');
  if (res.status >= 500) throw new RlstreamError('BACKEND_UNAVAILABLE', `${url}: HTTP ${res.status} ${text.slice(0, 200)}`);
  if (res.status >= 400) throw new RlstreamError('BACKEND_BAD_REQUEST', `${url}: HTTP ${res.status} ${text.slice(0, 500)}`);
  if (options.emptyOk && text.trim() === '') return null;
  try {
    return JSON.parse(text) as unknown;
  } catch (cause) {
    if (options.textOk) return text;
    throw new RlstreamError('BACKEND_BAD_REQUEST', `${url}: response is not JSON: ${text.slice(0, 200)}`, { cause });
  }
}

export async function getOk(url: string, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
  try {
    const signals = [AbortSignal.timeout(timeoutMs), signal].filter((s): s is AbortSignal => s !== undefined);
    const res = await fetch(url, { signal: AbortSignal.any(signals) });
    await res.arrayBuffer().catch(() => undefined);
    return res.ok;
  } catch {
    return false;
  }
}

function describeCause(err: unknown): string {
  const c = (err as { cause?: { code?: string; message?: string } }).cause;
  return c?.code ?? c?.message ?? (err as Error).message;
}

export function badResponse(url: string, what: string): RlstreamError {
  return new RlstreamError('BACKEND_BAD_REQUEST', `${url}: unexpected response: ${what}`);
}

/** An OpenAI-style finish reason: 'length' and 'abort' as such, anything else a stop. */
export function finishReasonOf(reason: unknown): FinishReason {
  return reason === 'length' ? 'length' : reason === 'abort' ? 'abort' : 'stop';
}

/**
 * The model an OpenAI-compatible server serves (the first of `/v1/models`), for servers that take a `model`
 * field but were not told its name in config. A failed look-up is not remembered, so the next call asks again.
 */
export class ServedModel {
  private name: Promise<string> | undefined;

  constructor(
    private readonly baseUrl: string,
    configured: string | undefined,
    private readonly headers: () => Record<string, string> = () => ({}),
  ) {
    if (configured) this.name = Promise.resolve(configured);
  }

  get(signal?: AbortSignal): Promise<string> {
    this.name ??= (async () => {
      const endpoint = `${this.baseUrl}/v1/models`;
      let body: { data?: { id?: string }[] };
      try {
        const res = await fetch(endpoint, { headers: this.headers(), ...(signal ? { signal } : {}) });
        body = (await res.json()) as typeof body;
      } catch (cause) {
        throw new RlstreamError('BACKEND_UNAVAILABLE', `${endpoint}: ${(cause as Error).message}`, { cause });
      }
      const id = body.data?.[0]?.id;
      if (!id) throw badResponse(endpoint, 'no model listed (set backend.model)');
      return id;
    })().catch((err: unknown) => {
      this.name = undefined;
      throw err;
    });
    return this.name;
  }
}

/**
 * An OpenAI-compatible server's /v1/completions: its base URL (no trailing slash), the model it serves
 * (configured, or asked through ServedModel) and a call that answers with the first choice.
 */
export class Completions {
  readonly url: string;
  private readonly model: ServedModel;

  constructor(
    address: string,
    configuredModel: string | undefined,
    private readonly headers: () => Record<string, string> = () => ({}),
  ) {
    this.url = address.replace(/\/+$/, '');
    this.model = new ServedModel(this.url, configuredModel, headers);
  }

  /** POSTs body(model) and gives choices[0] with the endpoint (for error messages); no choice is a bad response. */
  async firstChoice<C>(body: (model: string) => unknown, options: { signal?: AbortSignal | undefined; timeoutMs: number }): Promise<{ endpoint: string; choice: C }> {
    const endpoint = `${this.url}/v1/completions`;
    const model = await this.model.get(options.signal);
    const res = (await postJson(endpoint, body(model), { signal: options.signal, timeoutMs: options.timeoutMs, headers: this.headers() })) as { choices?: C[] };
    const choice = res.choices?.[0];
    if (!choice) throw badResponse(endpoint, 'no choices');
    return { endpoint, choice };
  }
}
