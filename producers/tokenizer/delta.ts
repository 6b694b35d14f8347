// Delta tokenization (verl's way): the tokens of new messages are the template rendered over
// [dummy prefix + new messages] minus the rendering of the dummy prefix alone, appended to the running
// token list without ever re-tokenizing what the policy generated. A sanity check compares the running
// list with a full re-tokenization of the conversation and reports (never throws) where they differ.
import type { ChatMessage, ChatTokenizer, ChatTool } from './chat-tokenizer.ts';

export type TokenizationCheckMode = 'strict' | 'ignore_strippable' | 'off';

/**
 * The dummy prefix. An empty message is what verl renders as its "system prompt" prefix: templates
 * that inject a default system message (Qwen2.5) do it here, and templates that do not (Qwen3) render
 * nothing, so the new messages are rendered as if they continued a conversation.
 */
const DUMMY_PREFIX: Record<string, unknown>[] = [{}];

export class DeltaTokenizer {
  private prefixText: string | undefined;
  private readonly cache = new Map<string, { ids: number[]; text: string }>();

  constructor(
    readonly tokenizer: ChatTokenizer,
    private readonly templateKwargs: Record<string, unknown> = {},
    private readonly cacheSize = 4096,
  ) {}

  /** Rendered text of new messages as the continuation of a conversation (with the generation prompt). */
  deltaText(messages: readonly ChatMessage[], addGenerationPrompt = true): string {
    this.prefixText ??= this.tokenizer.render(DUMMY_PREFIX, { templateKwargs: this.templateKwargs });
    const full = this.tokenizer.render([...DUMMY_PREFIX, ...messages] as Record<string, unknown>[], {
      addGenerationPrompt,
      templateKwargs: this.templateKwargs,
    });
    // A template that renders the prefix differently once messages follow it cannot be sliced by
    // position; fall back to rendering the new messages alone.
    if (!full.startsWith(this.prefixText)) return this.tokenizer.render(messages, { addGenerationPrompt, templateKwargs: this.templateKwargs });
    return full.slice(this.prefixText.length);
  }

  /** Token ids to append for new (tool, user) messages. */
  deltaIds(messages: readonly ChatMessage[], addGenerationPrompt = true): { ids: number[]; text: string } {
    // Rendering and BPE-encoding cost milliseconds; the same messages (a group's n samples getting the
    // same tool result, error messages, user-simulator replies) recur often, so results are cached.
    const key = addGenerationPrompt + JSON.stringify(messages);
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return { ids: [...hit.ids], text: hit.text };
    }
    const text = this.deltaText(messages, addGenerationPrompt);
    const out = { ids: this.tokenizer.encode(text), text };
    this.cache.set(key, { ids: [...out.ids], text });
    if (this.cache.size > this.cacheSize) this.cache.delete(this.cache.keys().next().value!);
    return out;
  }

  /** Token ids of the prompt (with the generation prompt): what the first turn is generated from. */
  promptIds(messages: readonly ChatMessage[], tools: ChatTool[] | null): number[] {
    return this.tokenizer.apply(messages, { tools, addGenerationPrompt: true, templateKwargs: this.templateKwargs });
  }

  /** Compare the running token list with a full re-tokenization of the whole conversation. */
  check(mode: TokenizationCheckMode, running: readonly number[], messages: readonly ChatMessage[], tools: ChatTool[] | null): TokenizationCheck {
    if (mode === 'off') return { checked: false, mismatch: false, detail: null };
    const full = this.tokenizer.apply(messages, { tools, addGenerationPrompt: true, templateKwargs: this.templateKwargs });
    return compareTokens(this.tokenizer, mode, running, full);
  }
}

export interface TokenizationCheck {
  checked: boolean;
  mismatch: boolean;
  /** Where the lists first differ (decoded), for logs and metrics; null when they agree. */
  detail: string | null;
}

/**
 * Walk both lists; `ignore_strippable` skips tokens that decode to whitespace only on either side (the
 * typical difference: the newline a template writes after an end-of-turn token that the model stopped
 * at), so only differences in visible text count as mismatches.
 */
export function compareTokens(tok: ChatTokenizer, mode: Exclude<TokenizationCheckMode, 'off'>, running: readonly number[], full: readonly number[]): TokenizationCheck {
  const blank = new Map<number, boolean>();
  const isBlank = (id: number): boolean => {
    let b = blank.get(id);
    if (b === undefined) {
      b = tok.decode([id]).trim() === '';
      blank.set(id, b);
    }
    return b;
  };
  let i = 0;
  let j = 0;
  while (i < running.length || j < full.length) {
    if (i < running.length && j < full.length && running[i] === full[j]) {
      i++;
      j++;
      continue;
    }
    if (mode === 'ignore_strippable') {
      const ri = running[i];
      const fj = full[j];
      if (ri !== undefined && isBlank(ri)) {
        i++;
        continue;
      }
      if (fj !== undefined && isBlank(fj)) {
        j++;
        continue;
      }
    }
    const around = (ids: readonly number[], k: number) => JSON.stringify(tok.decode(ids.slice(Math.max(0, k - 4), k + 6)));
    return { checked: true, mismatch: true, detail: `token ${i} (delta) vs ${j} (full): ${around(running, i)} vs ${around(full, j)}` };
  }
  return { checked: true, mismatch: false, detail: null };
}
