// The serving endpoint's tokenizer worker (a worker thread): renders and tokenizes big prompts so that the event
// loop, which answers every other call and /v1/models, never spends seconds in a chat template or BPE. It loads
// the run's tokenizer files itself (workerData) and answers requests by id.
import { parentPort, workerData } from 'node:worker_threads';
import { ChatTokenizer, type ChatMessage, type ChatTool } from '../tokenizer/chat-tokenizer.ts';

export interface TokenizeRequest {
  id: number;
  /** chat: the template with the generation prompt, then encode; text: encode only. */
  kind: 'chat' | 'text';
  messages?: ChatMessage[];
  tools?: ChatTool[] | null;
  templateKwargs?: Record<string, unknown>;
  text?: string;
}

export type TokenizeReply = { id: number; ids: number[] } | { id: number; error: string };

const { dir, chatTemplate } = workerData as { dir: string; chatTemplate: string | null };
const tokenizer = ChatTokenizer.load(dir, chatTemplate);

parentPort!.on('message', (r: TokenizeRequest) => {
  let reply: TokenizeReply;
  try {
    const ids = r.kind === 'text' ? tokenizer.encode(r.text ?? '') : tokenizer.apply(r.messages ?? [], { tools: r.tools ?? null, addGenerationPrompt: true, templateKwargs: r.templateKwargs ?? {} });
    reply = { id: r.id, ids };
  } catch (err) {
    reply = { id: r.id, error: (err as Error).message };
  }
  parentPort!.postMessage(reply);
});
