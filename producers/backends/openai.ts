// The generic OpenAI-compatible completions API (`POST /v1/completions`) as vLLM, SGLang and llama.cpp's
// server serve it: the prompt goes in as token ids, and the sampled tokens come back with their log-probs
// (`logprobs: 1`). Servers say which tokens they sampled in different places; the first one present wins:
//   choices[0].token_ids                       vLLM with return_token_ids, SGLang
//   choices[0].logprobs.content[].id           llama.cpp (chat-style log-probs, also on completions)
//   choices[0].logprobs.tokens = "token_id:N"  vLLM with return_tokens_as_token_ids
// A server that returns none of them gives only text: the ids are then re-derived by tokenizing the text
// with the run's tokenizer, and a re-derivation whose token count differs from the server's log-prob count
// is counted as a mismatch (the log-probs are then summed per re-derived token over character spans, which
// keeps each turn's total log-prob). Alternatives (GenerateRequest.topLogprobs) are asked as `logprobs: k` and read
// from llama.cpp's `content[].top_logprobs[].id` or vLLM's `top_logprobs` maps keyed `token_id:N`; a server that
// returns neither fails the call rather than answering without them.
import type { SamplingParams } from '../../schemas/generated/types.ts';
import type { ChatTokenizer } from '../tokenizer/chat-tokenizer.ts';
import { badResponse, Completions, finishReasonOf, getOk, type InferenceServer, type ServerOutput } from './http.ts';
import type { GenerateRequest, TokenAlternative } from './types.ts';

export interface OpenAiServerOptions {
  /** The served model name; default: the first id GET /v1/models lists, asked once. */
  model?: string;
  /** Bearer token sent as Authorization (read from the environment by the caller, never logged). */
  apiKey?: string;
  /** Extra request fields for one server kind (e.g. { top_k: 20 } or vLLM's { skip_special_tokens: false }). */
  extraBody?: Record<string, unknown>;
  requestTimeoutMs?: number;
  healthTimeoutMs?: number;
  /** Health endpoint path (default /health, which vLLM, SGLang and llama.cpp all serve). */
  healthPath?: string;
  /** Loaded on first need: re-derives token ids for servers that return text only. */
  tokenizer?: () => ChatTokenizer;
}

export function openAiCompletionBody(model: string, promptIds: number[], s: SamplingParams, extra: Record<string, unknown> = {}, topLogprobs = 0): Record<string, unknown> {
  const body: Record<string, unknown> = {
    model,
    prompt: promptIds,
    max_tokens: s.max_new_tokens,
    temperature: s.temperature,
    top_p: s.top_p,
    logprobs: Math.max(1, topLogprobs),
    stream: false,
    // Extensions the servers that know them honour and the others ignore: token ids in the answer (vLLM) and
    // stop tokens by id (vLLM, SGLang; llama.cpp stops at the model's end-of-generation tokens itself).
    return_tokens_as_token_ids: true,
    stop_token_ids: s.stop_token_ids,
  };
  if (s.top_k > 0) body['top_k'] = s.top_k;
  if (s.seed !== null) body['seed'] = s.seed;
  return { ...body, ...extra };
}

interface Choice {
  text?: unknown;
  token_ids?: unknown;
  finish_reason?: unknown;
  logprobs?: { tokens?: unknown[]; token_logprobs?: (number | null)[]; top_logprobs?: unknown[]; content?: { id?: unknown; token?: unknown; logprob?: unknown; top_logprobs?: unknown }[] } | null;
}

/** The most alternatives per token asked of an OpenAI-compatible server (OpenAI's own chat limit). */
const MAX_TOP_LOGPROBS = 20;

/**
 * Per token, the alternatives the server returned, most probable first: llama.cpp's content[].top_logprobs
 * ({id, logprob}) or vLLM's top_logprobs ({"token_id:N": logprob}); null when neither is there with ids.
 */
export function alternativesFromChoice(choice: Choice): TokenAlternative[][] | null {
  const lp = choice.logprobs ?? null;
  const sorted = (alts: TokenAlternative[]) => alts.sort((a, b) => b.logprob - a.logprob || a.token - b.token);
  if (Array.isArray(lp?.content) && lp.content.every((c) => Array.isArray(c.top_logprobs))) {
    const out = lp.content.map((c) => (c.top_logprobs as { id?: unknown; logprob?: unknown }[]).map((a) => ({ token: a.id, logprob: a.logprob })));
    if (out.every((alts) => alts.every((a) => Number.isInteger(a.token) && typeof a.logprob === 'number'))) return out.map((alts) => sorted(alts as TokenAlternative[]));
    return null;
  }
  if (Array.isArray(lp?.top_logprobs) && lp.top_logprobs.every((m) => m !== null && typeof m === 'object')) {
    const out: TokenAlternative[][] = [];
    for (const m of lp.top_logprobs as Record<string, unknown>[]) {
      const alts: TokenAlternative[] = [];
      for (const [key, v] of Object.entries(m)) {
        const id = /^token_id:(\d+)$/.exec(key);
        if (!id || typeof v !== 'number') return null;
        alts.push({ token: Number(id[1]), logprob: v });
      }
      out.push(sorted(alts));
    }
    return out;
  }
  return null;
}

const finite = (x: unknown): number => (typeof x === 'number' && Number.isFinite(x) ? x : 0);

/** Token ids and log-probs from one choice, or null when the server returned no ids. */
export function idsFromChoice(endpoint: string, choice: Choice): { tokenIds: number[]; logprobs: number[] } | null {
  const lp = choice.logprobs ?? null;
  const content = Array.isArray(lp?.content) ? lp.content : null;
  const logprobs = content ? content.map((c) => finite(c.logprob)) : Array.isArray(lp?.token_logprobs) ? lp.token_logprobs.map(finite) : null;
  let ids: number[] | null = null;
  if (Array.isArray(choice.token_ids) && choice.token_ids.every((x) => Number.isInteger(x))) ids = choice.token_ids as number[];
  else if (content && content.every((c) => Number.isInteger(c.id))) ids = content.map((c) => c.id as number);
  else if (Array.isArray(lp?.tokens) && lp.tokens.length > 0 && lp.tokens.every((t) => typeof t === 'string' && /^token_id:\d+$/.test(t))) {
    ids = lp.tokens.map((t) => Number((t as string).slice('token_id:'.length)));
  }
  if (ids === null) return null;
  if (logprobs === null) throw badResponse(endpoint, 'no log-probs (choices[0].logprobs) although logprobs: 1 was asked');
  if (logprobs.length !== ids.length) throw badResponse(endpoint, `${ids.length} token ids but ${logprobs.length} log-probs`);
  return { tokenIds: ids, logprobs };
}

/**
 * Ids re-derived from the text, with log-probs moved onto them: each server token's log-prob goes to the
 * re-derived token in which the server token ends (by character offsets), so a turn's sum is kept.
 */
export function rederive(text: string, serverTokens: string[] | null, serverLogprobs: number[], tokenizer: ChatTokenizer): { tokenIds: number[]; logprobs: number[]; mismatch: boolean } {
  const tokenIds = tokenizer.encode(text);
  const mismatch = tokenIds.length !== serverLogprobs.length;
  if (!mismatch) return { tokenIds, logprobs: serverLogprobs, mismatch };
  const ends: number[] = [];
  let at = 0;
  for (const id of tokenIds) {
    at += tokenizer.decode([id]).length;
    ends.push(at);
  }
  const logprobs = tokenIds.map(() => 0);
  let pos = 0;
  let k = 0;
  for (let i = 0; i < serverLogprobs.length; i++) {
    pos += serverTokens?.[i]?.length ?? 0;
    while (k < ends.length - 1 && ends[k]! < pos) k++;
    if (logprobs.length > 0) logprobs[k]! += serverLogprobs[i]!;
  }
  return { tokenIds, logprobs, mismatch };
}

export class OpenAiServer implements InferenceServer {
  private readonly api: Completions;
  readonly maxTopLogprobs = MAX_TOP_LOGPROBS;

  constructor(
    readonly address: string,
    private readonly options: OpenAiServerOptions = {},
  ) {
    this.api = new Completions(address, options.model, () => this.headers());
  }

  private headers(): Record<string, string> {
    return this.options.apiKey ? { authorization: `Bearer ${this.options.apiKey}` } : {};
  }

  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<ServerOutput> {
    const { endpoint, choice } = await this.api.firstChoice<Choice>(
      (model) => openAiCompletionBody(model, request.promptIds, request.sampling, this.options.extraBody, request.topLogprobs ?? 0),
      { signal, timeoutMs: this.options.requestTimeoutMs ?? 600_000 },
    );
    const finishReason = finishReasonOf(choice.finish_reason);
    const direct = idsFromChoice(endpoint, choice);
    if (direct && (request.topLogprobs ?? 0) > 0) {
      const k = request.topLogprobs!;
      const alts = alternativesFromChoice(choice);
      if (!alts || alts.length !== direct.tokenIds.length) throw badResponse(endpoint, `no alternatives with token ids per token (choices[0].logprobs) although logprobs: ${k} was asked`);
      return { ...direct, finishReason, topLogprobs: alts.map((a) => a.slice(0, k)) };
    }
    if (direct) return { ...direct, finishReason };
    if ((request.topLogprobs ?? 0) > 0) throw badResponse(endpoint, 'alternatives were asked, but the server returned no token ids to place them');
    if (typeof choice.text !== 'string') throw badResponse(endpoint, 'neither token ids nor text in choices[0]');
    if (!this.options.tokenizer) throw badResponse(endpoint, 'no token ids returned, and no tokenizer to re-derive them (set model.tokenizer)');
    const lp = choice.logprobs ?? null;
    const serverTokens = Array.isArray(lp?.tokens) ? lp.tokens.map((t) => String(t)) : Array.isArray(lp?.content) ? lp.content.map((c) => String(c.token ?? '')) : null;
    const serverLogprobs = Array.isArray(lp?.token_logprobs) ? lp.token_logprobs.map(finite) : Array.isArray(lp?.content) ? lp.content.map((c) => finite(c.logprob)) : [];
    const r = rederive(choice.text, serverTokens, serverLogprobs, this.options.tokenizer());
    return { tokenIds: r.tokenIds, logprobs: r.logprobs, finishReason, retokenized: { mismatch: r.mismatch } };
  }

  health(signal?: AbortSignal): Promise<boolean> {
    return getOk(`${this.api.url}${this.options.healthPath ?? '/health'}`, this.options.healthTimeoutMs ?? 5_000, signal);
  }
}
