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
/** For templates that cannot render an empty message (SmolLM2's concatenates message['role']): a real one. */
const SYSTEM_PREFIX: Record<string, unknown>[] = [{ role: 'system', content: '' }];

/**
 * Contents a rendering is checked against before it is reused as fixed text around the content: empty,
 * blank, padded, and texts that the field's templates branch on (tool-response wrappers, think blocks,
 * tool-call blocks, JSON, quotes and escapes, Python-ish literals).
 */
const PROBES = [
  '',
  ' ',
  '\n',
  'x',
  '  padded text \n\n',
  'The answer is 24.\n#### 24',
  '<tool_response>\nr\n</tool_response>',
  '<think>\nreasoning\n</think>\n\nanswer',
  '</think>',
  '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
  'a"b\'c\\d\te\u2028f\u00e9',
  '{"a": [1, 2]}',
  'None',
  'true',
  '0',
  '[]',
];

/** Marks message i's content in a probe rendering (private-use characters no template writes). */
const sentinel = (i: number): string => `\uE000${i}\uE001`;

/**
 * A rendering as fixed parts around each message's content: parts[0] + c0 + parts[1] + ... + c(n-1) +
 * parts[n]; null when the rendering depends on the contents otherwise (then it is always rendered).
 */
type Skeleton = readonly string[] | null;

function fill(parts: readonly string[], messages: readonly ChatMessage[]): string {
  let out = parts[0]!;
  for (let i = 0; i < messages.length; i++) out += messages[i]!.content + parts[i + 1]!;
  return out;
}

function withContents(messages: readonly ChatMessage[], content: (i: number) => string): ChatMessage[] {
  return messages.map((m, i) => ({ ...m, content: content(i) }));
}

export interface DeltaTokenizerOptions {
  /** Delta results cached by exact messages (LRU). Default 4096. */
  cacheSize?: number;
  /**
   * Reuse renderings of a message shape (everything but the contents) as fixed text around the
   * contents, once the shape's rendering is found to be content-opaque on PROBES. Default true.
   */
  shapes?: boolean;
  /** Message shapes remembered. Default 1024. */
  maxShapes?: number;
}

export class DeltaTokenizer {
  private prefixText: string | undefined;
  private prefix: Record<string, unknown>[] = DUMMY_PREFIX;
  private readonly cache = new Map<string, { ids: number[]; text: string }>();
  private readonly cacheSize: number;
  private readonly useShapes: boolean;
  private readonly maxShapes: number;
  /** Learned skeletons; a shape seen once maps to undefined-as-"seen" (learned on the second sight). */
  private readonly skeletons = new Map<string, Skeleton | 'seen'>();
  private shapeHits = 0;
  /** gapAfter's results by end-of-turn token and the role that follows. */
  private readonly gaps = new Map<string, string>();

  constructor(
    readonly tokenizer: ChatTokenizer,
    private readonly templateKwargs: Record<string, unknown> = {},
    options: DeltaTokenizerOptions | number = {},
  ) {
    const o = typeof options === 'number' ? { cacheSize: options } : options;
    this.cacheSize = o.cacheSize ?? 4096;
    this.useShapes = o.shapes ?? true;
    this.maxShapes = o.maxShapes ?? 1024;
  }

  /** Rendered text of new messages as the continuation of a conversation (with the generation prompt). */
  deltaText(messages: readonly ChatMessage[], addGenerationPrompt = true): string {
    return this.viaShape(`d${addGenerationPrompt ? 1 : 0}`, messages, (m) => this.renderDelta(m, addGenerationPrompt));
  }

  /** deltaText by the template itself, never through a learned shape. */
  private renderDelta(messages: readonly ChatMessage[], addGenerationPrompt: boolean): string {
    if (this.prefixText === undefined) {
      try {
        this.prefixText = this.tokenizer.render(DUMMY_PREFIX, { templateKwargs: this.templateKwargs });
      } catch {
        this.prefix = SYSTEM_PREFIX;
        this.prefixText = this.tokenizer.render(SYSTEM_PREFIX, { templateKwargs: this.templateKwargs });
      }
    }
    const full = this.tokenizer.render([...this.prefix, ...messages] as Record<string, unknown>[], {
      addGenerationPrompt,
      templateKwargs: this.templateKwargs,
    });
    // A template that renders the prefix differently once messages follow it cannot be sliced by
    // position; fall back to rendering the new messages alone.
    if (!full.startsWith(this.prefixText)) return this.tokenizer.render(messages, { addGenerationPrompt, templateKwargs: this.templateKwargs });
    return full.slice(this.prefixText.length);
  }

  /**
   * Render through the shape's skeleton when there is one. The template interpreter costs a fraction of
   * a millisecond per call, and tool results, user replies and prompts mostly differ only in content:
   * a shape (roles, names, tool-call ids, everything but the contents) seen twice is rendered with
   * sentinels in place of the contents, split into fixed parts, and kept only if the parts reproduce
   * the template's output for every probe content and for the real messages.
   */
  private viaShape(kind: string, messages: readonly ChatMessage[], render: (m: readonly ChatMessage[]) => string): string {
    if (!this.useShapes || messages.length === 0) return render(messages);
    let key = kind;
    for (const m of messages) {
      if (typeof m.content !== 'string') return render(messages);
      const { content: _content, ...rest } = m;
      key += '\u0000' + JSON.stringify(rest);
    }
    const known = this.skeletons.get(key);
    if (known !== undefined && known !== 'seen') {
      if (known === null) return render(messages);
      this.shapeHits++;
      return fill(known, messages);
    }
    const text = render(messages);
    if (known === undefined) {
      if (this.skeletons.size >= this.maxShapes) this.skeletons.delete(this.skeletons.keys().next().value!);
      this.skeletons.set(key, 'seen');
    } else this.skeletons.set(key, this.learn(messages, render, text));
    return text;
  }

  private learn(messages: readonly ChatMessage[], render: (m: readonly ChatMessage[]) => string, actual: string): Skeleton {
    try {
      const probe = render(withContents(messages, sentinel));
      const parts: string[] = [];
      let pos = 0;
      for (let i = 0; i < messages.length; i++) {
        const s = sentinel(i);
        const at = probe.indexOf(s, pos);
        if (at < 0 || probe.indexOf(s, at + s.length) >= 0) return null;
        parts.push(probe.slice(pos, at));
        pos = at + s.length;
      }
      parts.push(probe.slice(pos));
      if (fill(parts, messages) !== actual) return null;
      const distinct = withContents(messages, (i) => `probe ${i}`);
      if (fill(parts, distinct) !== render(distinct)) return null;
      for (const p of [...PROBES, this.tokenizer.eosToken ?? '', this.tokenizer.bosToken ?? '']) {
        const m = withContents(messages, () => p);
        if (fill(parts, m) !== render(m)) return null;
      }
      return parts;
    } catch {
      // A probe the template refuses (raise_exception on empty content, say): not content-opaque.
      return null;
    }
  }

  /**
   * The text the template writes after an assistant turn's end-of-turn token `stop` and before the messages
   * that follow it (ChatML: the newline after `<|im_end|>`); '' where the rendering does not show one.
   * The model stops at the token and never generates this text, so it opens the next observation: masked,
   * and the conversation rendered whole gives back the trajectory's tokens exactly.
   */
  gapAfter(stop: string, next: readonly ChatMessage[]): string {
    const key = `${stop}\u0000${next[0]?.role ?? ''}`;
    let gap = this.gaps.get(key);
    if (gap === undefined) {
      gap = '';
      try {
        const mark = sentinel(0);
        const full = this.tokenizer.render([{ role: 'user', content: 'q' }, { role: 'assistant', content: mark }, ...next], {
          addGenerationPrompt: true,
          templateKwargs: this.templateKwargs,
        });
        const rest = this.deltaText(next, true);
        const at = full.indexOf(mark + stop);
        const from = at + mark.length + stop.length;
        if (at >= 0 && full.endsWith(rest) && full.length - rest.length >= from) gap = full.slice(from, full.length - rest.length);
      } catch {
        // A template that refuses this conversation shape: no gap is known, the delta stands alone.
      }
      this.gaps.set(key, gap);
    }
    return gap;
  }

  /**
   * Token ids to append for new (tool, user) messages. `afterStop`: the text of the end-of-turn token the
   * previous assistant turn stopped at, if it did; the template's text after that token then leads the delta.
   */
  deltaIds(messages: readonly ChatMessage[], addGenerationPrompt = true, afterStop: string | null = null): { ids: number[]; text: string } {
    // The same messages (a group's n samples getting the same tool result, error messages, user-simulator
    // replies) recur often, so results are cached by their exact messages.
    const key = `${addGenerationPrompt}${afterStop ?? ''}\u0000${JSON.stringify(messages)}`;
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      this.cache.set(key, hit);
      return { ids: [...hit.ids], text: hit.text };
    }
    const text = (afterStop === null ? '' : this.gapAfter(afterStop, messages)) + this.deltaText(messages, addGenerationPrompt);
    const out = { ids: this.tokenizer.encode(text), text };
    if (this.cacheSize > 0) {
      this.cache.set(key, { ids: [...out.ids], text });
      if (this.cache.size > this.cacheSize) this.cache.delete(this.cache.keys().next().value!);
    }
    return out;
  }

  /** Token ids of the prompt (with the generation prompt): what the first turn is generated from. */
  promptIds(messages: readonly ChatMessage[], tools: ChatTool[] | null): number[] {
    const opts = { tools, addGenerationPrompt: true, templateKwargs: this.templateKwargs };
    const kind = `p${tools && tools.length > 0 ? JSON.stringify(tools) : ''}`;
    return this.tokenizer.encode(this.viaShape(kind, messages, (m) => this.tokenizer.render(m, opts)));
  }

  /**
   * Compare the running token list with a full re-tokenization of the whole conversation. The full
   * rendering is always the template's own (never a learned shape), so the check stays independent.
   */
  check(mode: TokenizationCheckMode, running: readonly number[], messages: readonly ChatMessage[], tools: ChatTool[] | null): TokenizationCheck {
    if (mode === 'off') return { checked: false, mismatch: false, detail: null };
    const full = this.tokenizer.apply(messages, { tools, addGenerationPrompt: true, templateKwargs: this.templateKwargs });
    return compareTokens(this.tokenizer, mode, running, full);
  }

  /** Cache statistics (for benchmarks and metrics). */
  stats(): { shapes: number; shapeHits: number; deltaCacheEntries: number } {
    return { shapes: this.skeletons.size, shapeHits: this.shapeHits, deltaCacheEntries: this.cache.size };
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
