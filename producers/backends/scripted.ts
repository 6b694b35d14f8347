// ScriptedBackend: a TEST DOUBLE of an LLM backend. A script (a function of the prompt) says what the
// "model" answers; the text is tokenized with the real tokenizer, an end-of-turn token appended, the
// answer cut at max_new_tokens (finish 'length') and given fixed log-probs (and, when asked, fixed alternatives:
// the token itself, then the next ids at log-probs 2, 3, … below it). For tests and benchmarks of everything
// around generation; it samples nothing.
import { sleep } from '../../core/retry.ts';
import type { ChatTokenizer } from '../tokenizer/chat-tokenizer.ts';
import type { FinishReason, GenerateRequest, GenerateResult, LlmBackend, PolicyUpdate } from './types.ts';

export interface ScriptTurn {
  request: GenerateRequest;
  /** Turns already generated in this session (0 for the first). */
  turn: number;
  /** The prompt decoded (lazily, with special tokens). */
  promptText(): string;
}

export type ScriptAnswer = string | { text?: string; tokenIds?: number[]; finishReason?: FinishReason; appendEos?: boolean };

export interface ScriptedBackendOptions {
  tokenizer?: ChatTokenizer;
  script: (turn: ScriptTurn) => ScriptAnswer | Promise<ScriptAnswer>;
  /** Simulated generation latency per call (number or a sampler), default 0 (answers in a microtask). */
  latencyMs?: number | (() => number);
  /** Log-prob reported for every token (default -0.25). */
  logprob?: number;
  /** Alternatives it returns at most (default 20; 0: none, as a backend that computes none). */
  maxTopLogprobs?: number;
  name?: string;
}

export class ScriptedBackend implements LlmBackend {
  readonly name: string;
  readonly maxTopLogprobs?: number;
  private version = 0;
  private readonly turns = new Map<string, number>();
  readonly requests: GenerateRequest[] = [];
  /** Keep the last requests only (benchmarks generate millions). */
  recordRequests = true;

  constructor(private readonly o: ScriptedBackendOptions) {
    this.name = o.name ?? 'scripted';
    if ((o.maxTopLogprobs ?? 20) > 0) this.maxTopLogprobs = o.maxTopLogprobs ?? 20;
  }

  currentPolicyVersion(): number {
    return this.version;
  }

  async updatePolicy(update: PolicyUpdate): Promise<void> {
    this.version = update.version;
  }

  releaseSession(sessionId: string): void {
    this.turns.delete(sessionId);
  }

  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    const t0 = performance.now();
    if (this.recordRequests) this.requests.push(request);
    const key = request.sessionId ?? request.requestId;
    const turn = this.turns.get(key) ?? 0;
    this.turns.set(key, turn + 1);
    const latency = typeof this.o.latencyMs === 'function' ? this.o.latencyMs() : (this.o.latencyMs ?? 0);
    if (latency > 0) await sleep(latency, signal);
    if (signal?.aborted) throw signal.reason as Error;
    const tok = this.o.tokenizer;
    const answer = await this.o.script({ request, turn, promptText: () => (tok ? tok.decode(request.promptIds) : '') });
    const a = typeof answer === 'string' ? { text: answer } : answer;
    const text = a.text;
    let ids = a.tokenIds ?? (text !== undefined && tok ? tok.encode(text) : []);
    let finish: FinishReason = a.finishReason ?? 'stop';
    if (finish === 'stop' && (a.appendEos ?? true) && tok?.eosTokenId != null) ids = [...ids, tok.eosTokenId];
    const max = request.sampling.max_new_tokens;
    if (ids.length > max) {
      ids = ids.slice(0, max);
      finish = 'length';
    }
    const version = this.version;
    const lp = this.o.logprob ?? -0.25;
    const k = request.topLogprobs ?? 0;
    return {
      tokenIds: ids,
      logprobs: ids.map(() => lp),
      ...(k > 0 ? { topLogprobs: ids.map((t) => Array.from({ length: k }, (_, j) => ({ token: t + j, logprob: j === 0 ? lp : lp - 1 - j }))) } : {}),
      finishReason: finish,
      policyVersions: ids.map(() => version),
      server: this.name,
      latencyMs: performance.now() - t0,
    };
  }

  async close(): Promise<void> {}
}
