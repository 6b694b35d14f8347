// SFT demonstrations for the calculator task, tokenized exactly as a rollout would hold them: the prompt
// and tool responses (response_mask 0) through delta tokenization, and each assistant message as the tokens the
// policy would generate after the generation prompt, up to and including the end-of-turn token (response_mask 1).
import type { ChatTokenizer, ChatMessage } from '../../producers/tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from '../../producers/tokenizer/delta.ts';
import type { SftExample } from '../../core/tasks/demonstration.ts';
import { CALCULATOR_TOOL, demonstration } from './conversation.ts';
import type { Problem } from './task.ts';

/** The text the policy generates for an assistant message: after the generation prompt, through EOS. */
export function assistantGenerationText(tok: ChatTokenizer, message: ChatMessage): string {
  const dummy = [{}];
  const withPrompt = tok.render(dummy, { addGenerationPrompt: true });
  const bare = tok.render(dummy);
  const genPrompt = withPrompt.slice(bare.length);
  const rendered = tok.render([...dummy, message] as Record<string, unknown>[]).slice(bare.length);
  if (!rendered.startsWith(genPrompt)) throw new Error('chat template renders assistant messages without its generation prompt');
  const body = rendered.slice(genPrompt.length);
  const eos = tok.eosToken ?? '';
  const end = body.indexOf(eos);
  return end < 0 ? body : body.slice(0, end + eos.length);
}

export function demonstrationExample(tok: ChatTokenizer, problem: Problem, direct = false): SftExample {
  const delta = new DeltaTokenizer(tok);
  const messages = demonstration(problem, direct);
  const tokens: number[] = [];
  const responseMask: number[] = [];
  const push = (ids: number[], m: number) => {
    tokens.push(...ids);
    for (let i = 0; i < ids.length; i++) responseMask.push(m);
  };
  push(delta.promptIds(messages.slice(0, 2), [CALCULATOR_TOOL]), 0);
  // After an assistant message (which ends at the end-of-turn token), the observation opens with the template's
  // text after that token, as a rollout's does.
  let afterStop: string | null = null;
  for (const msg of messages.slice(2)) {
    if (msg.role === 'assistant') {
      push(tok.encode(assistantGenerationText(tok, msg)), 1);
      afterStop = tok.eosToken ?? null;
    } else {
      push(delta.deltaIds([msg], true, afterStop).ids, 0);
      afterStop = null;
    }
  }
  return { tokens, responseMask };
}
