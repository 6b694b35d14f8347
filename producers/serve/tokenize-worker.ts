// The serving endpoint's tokenizer worker (a worker thread): renders and tokenizes big prompts and big
// observations (tool results, user messages) so that the event loop, which answers every other call and
// /v1/models, never spends seconds in a chat template or BPE. It loads the run's tokenizer files itself
// (workerData) and answers requests by id.
import { parentPort, workerData } from 'node:worker_threads';
import { ChatTokenizer, type ChatMessage, type ChatTool } from '../tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer, type TokenizationCheck, type TokenizationCheckMode } from '../tokenizer/delta.ts';

export type TokenizeRequest = { id: number } & (
  | { kind: 'chat'; messages: ChatMessage[]; tools: ChatTool[] | null; templateKwargs: Record<string, unknown> }
  | { kind: 'text'; text: string }
  | {
      /** appendObservation's tokenization: the delta ids of new messages, their text, and the check. */
      kind: 'observe';
      messages: ChatMessage[];
      afterStop: string | null;
      templateKwargs: Record<string, unknown>;
      /** The check against a full re-rendering: the context ids so far and the whole conversation with the new messages. */
      check: { mode: TokenizationCheckMode; context: number[]; conversation: ChatMessage[]; tools: ChatTool[] | null } | null;
    }
);

export type TokenizeReply = { id: number; ids: number[]; text?: string; check?: TokenizationCheck | null } | { id: number; error: string };

const { dir, chatTemplate } = workerData as { dir: string; chatTemplate: string | null };
const tokenizer = ChatTokenizer.load(dir, chatTemplate);
/** One delta tokenizer per set of template kwargs (a run has one). */
const deltas = new Map<string, DeltaTokenizer>();

function handle(r: TokenizeRequest): TokenizeReply {
  switch (r.kind) {
    case 'text':
      return { id: r.id, ids: tokenizer.encode(r.text) };
    case 'chat':
      return { id: r.id, ids: tokenizer.apply(r.messages, { tools: r.tools, addGenerationPrompt: true, templateKwargs: r.templateKwargs }) };
    case 'observe': {
      const key = JSON.stringify(r.templateKwargs);
      let delta = deltas.get(key);
      if (!delta) deltas.set(key, (delta = new DeltaTokenizer(tokenizer, r.templateKwargs)));
      const { ids } = delta.deltaIds(r.messages, true, r.afterStop);
      const check = r.check ? delta.check(r.check.mode, r.check.context.concat(ids), r.check.conversation, r.check.tools) : null;
      return { id: r.id, ids, text: tokenizer.decode(ids, { skipSpecialTokens: true }), check };
    }
  }
}

parentPort!.on('message', (r: TokenizeRequest) => {
  let reply: TokenizeReply;
  try {
    reply = handle(r);
  } catch (err) {
    reply = { id: r.id, error: (err as Error).message };
  }
  parentPort!.postMessage(reply);
});
