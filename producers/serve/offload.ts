// Big prompts and big observations (tool results, user messages) are tokenized in a worker thread
// (tokenize-worker.ts), one at a time in arrival order, so that rendering and encoding megabytes of conversation
// never holds the event loop (other calls and /v1/models keep answering). Small ones stay on the event loop,
// where the delta tokenizer's caches make them cheap. The worker starts with the first big request and is
// restarted after a crash.
import { Worker } from 'node:worker_threads';
import type { PreparedObservation } from '../agent/steps.ts';
import type { ChatMessage, ChatTool } from '../tokenizer/chat-tokenizer.ts';
import type { TokenizationCheckMode } from '../tokenizer/delta.ts';
import type { TokenizeReply, TokenizeRequest } from './tokenize-worker.ts';

type Reply = Exclude<TokenizeReply, { error: string }>;
/** A request as the caller writes it (the id is the offload's). */
type Request = TokenizeRequest extends infer R ? (R extends TokenizeRequest ? Omit<R, 'id'> : never) : never;

/** Prompts of at least this many characters (messages' content and tools together) are tokenized in the worker. */
export const OFFLOAD_MIN_CHARS = 64 * 1024;

export class TokenizeOffload {
  private worker: Worker | null = null;
  private next = 1;
  private readonly pending = new Map<number, { resolve: (reply: Reply) => void; reject: (err: Error) => void }>();
  private closed = false;

  constructor(private readonly files: { dir: string; chatTemplate: string | null }) {}

  /** The chat template with the generation prompt, then encode, in the worker. */
  async chat(messages: ChatMessage[], tools: ChatTool[] | null, templateKwargs: Record<string, unknown>): Promise<number[]> {
    return (await this.send({ kind: 'chat', messages, tools, templateKwargs })).ids;
  }

  /** encode(text) in the worker. */
  async text(text: string): Promise<number[]> {
    return (await this.send({ kind: 'text', text })).ids;
  }

  /**
   * appendObservation's tokenization of new messages in the worker: their delta ids after the recorded context
   * (`afterStop`: the end-of-turn token the last assistant turn stopped at), and with `check` the tokenization
   * check of the whole conversation (with the new messages) against the context ids followed by the delta.
   */
  async observe(
    messages: ChatMessage[],
    afterStop: string | null,
    templateKwargs: Record<string, unknown>,
    check: { mode: TokenizationCheckMode; context: number[]; conversation: ChatMessage[]; tools: ChatTool[] | null } | null,
  ): Promise<PreparedObservation> {
    const r = await this.send({ kind: 'observe', messages, afterStop, templateKwargs, check: check && check.mode !== 'off' ? check : null });
    return { ids: r.ids, text: r.text ?? '', check: r.check ?? null };
  }

  private send(r: Request): Promise<Reply> {
    if (this.closed) return Promise.reject(new Error('the tokenizer worker is closed'));
    const id = this.next++;
    return new Promise<Reply>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.start().postMessage({ ...r, id });
    });
  }

  private start(): Worker {
    if (this.worker) return this.worker;
    const w = new Worker(new URL('./tokenize-worker.mjs', import.meta.url), { workerData: this.files });
    w.unref();
    w.on('message', (m: TokenizeReply) => {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if ('error' in m) p.reject(new Error(m.error));
      else p.resolve(m);
    });
    const fail = (err: Error) => {
      if (this.worker === w) this.worker = null;
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
    };
    w.on('error', fail);
    w.on('exit', (code) => fail(new Error(`the tokenizer worker exited (code ${code})`)));
    this.worker = w;
    return w;
  }

  async close(): Promise<void> {
    this.closed = true;
    const w = this.worker;
    this.worker = null;
    if (w) await w.terminate();
  }
}

/** How many characters a prompt's (or an observation's) messages (content and tool-call arguments) and tools hold: where it is tokenized. */
export function promptChars(messages: readonly { content: string; tool_calls: readonly { arguments: string }[] }[], tools: readonly ChatTool[]): number {
  let n = 0;
  for (const m of messages) {
    n += m.content.length;
    for (const c of m.tool_calls) n += c.arguments.length;
  }
  return tools.length === 0 ? n : n + JSON.stringify(tools).length;
}
