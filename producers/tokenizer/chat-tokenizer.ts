// A Hugging Face tokenizer (tokenizer.json) plus its Jinja chat template (tokenizer_config.json), loaded
// from a directory: the one object agent loops use to turn messages into token ids and back.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { RlstreamError } from '../../core/errors.ts';
import { SegmentEncoder } from './segments.ts';

/** A message as chat templates read it (OpenAI / Hugging Face shape). */
export interface ChatMessage {
  role: string;
  content: string;
  tool_calls?: { id?: string; type?: 'function'; function: { name: string; arguments: string | Record<string, unknown> } }[];
  tool_call_id?: string;
  name?: string;
  [extra: string]: unknown;
}

/** A tool in the OpenAI function shape, as templates expect it in `tools`. */
export interface ChatTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown> };
}

export interface RenderOptions {
  tools?: ChatTool[] | null;
  addGenerationPrompt?: boolean;
  /** Extra template variables (e.g. enable_thinking). */
  templateKwargs?: Record<string, unknown>;
}

interface TokenizerConfig {
  chat_template?: string | { name: string; template: string }[];
  eos_token?: string | { content: string } | null;
  bos_token?: string | { content: string } | null;
  pad_token?: string | { content: string } | null;
  [key: string]: unknown;
}

function tokenText(t: string | { content: string } | null | undefined): string | null {
  if (t === null || t === undefined) return null;
  return typeof t === 'string' ? t : t.content;
}

function readJson(path: string, what: string): unknown {
  if (!existsSync(path)) throw new RlstreamError('TOKENIZER', `${what} not found: ${path}`);
  try {
    return JSON.parse(readFileSync(path, 'utf8'));
  } catch (cause) {
    throw new RlstreamError('TOKENIZER', `${what} is not valid JSON: ${path}`, { cause });
  }
}

export class ChatTokenizer {
  readonly eosToken: string | null;
  readonly eosTokenId: number | null;
  readonly bosToken: string | null;
  readonly padTokenId: number | null;
  /** Special tokens by text (added tokens flagged special in tokenizer.json). */
  readonly specialTokens: ReadonlyMap<string, number>;
  private readonly specialIds: ReadonlySet<number>;
  /** Ids decode() drops with skipSpecialTokens: special added tokens plus additional_special_tokens. */
  private readonly skippedIds: ReadonlySet<number>;
  private readonly skipIsFilterOnly: boolean;
  private readonly template: Template;
  /** Cached encoding by added-token segment; null when the tokenizer's shape does not allow it. */
  private readonly segments: SegmentEncoder | null;

  private constructor(
    private readonly tokenizer: Tokenizer,
    config: TokenizerConfig,
    /** The chat template in use (model.chat_template's, else the directory's): the tool-call format follows it. */
    readonly templateText: string,
    readonly dir: string,
    tokenizerJson: { normalizer?: unknown; model?: unknown },
  ) {
    try {
      this.template = new Template(templateText);
    } catch (cause) {
      throw new RlstreamError('TOKENIZER', `chat template of ${dir} does not parse: ${(cause as Error).message}`, { cause });
    }
    const special = new Map<string, number>();
    for (const [id, tok] of tokenizer.get_added_tokens_decoder()) if (tok.special) special.set(tok.content, id);
    this.specialTokens = special;
    this.specialIds = new Set(special.values());
    const skipped = new Set(special.values());
    const extra = config['additional_special_tokens'];
    if (Array.isArray(extra)) {
      for (const t of extra) {
        const id = typeof t === 'string' ? tokenizer.token_to_id(t) : undefined;
        if (id !== undefined) skipped.add(id);
      }
    }
    this.skippedIds = skipped;
    // Decoders with an end-of-word suffix also trim the text when skipping; others only filter ids.
    this.skipIsFilterOnly = !(tokenizerJson.model as { end_of_word_suffix?: unknown } | undefined)?.end_of_word_suffix;
    this.eosToken = tokenText(config.eos_token);
    this.bosToken = tokenText(config.bos_token);
    this.eosTokenId = this.eosToken === null ? null : (tokenizer.token_to_id(this.eosToken) ?? null);
    const pad = tokenText(config.pad_token);
    this.padTokenId = pad === null ? null : (tokenizer.token_to_id(pad) ?? null);
    this.segments = SegmentEncoder.create(tokenizer, tokenizerJson.normalizer != null, (text) => this.encodeUncached(text));
  }

  /**
   * Load tokenizer.json and tokenizer_config.json from a directory. The chat template comes from
   * tokenizer_config.json's `chat_template` (string, or the entry named "default"), else chat_template.jinja;
   * `chatTemplateFile` (model.chat_template) replaces both.
   */
  static load(dir: string, chatTemplateFile?: string | null): ChatTokenizer {
    const tokJson = readJson(join(dir, 'tokenizer.json'), 'tokenizer.json') as object;
    const config = readJson(join(dir, 'tokenizer_config.json'), 'tokenizer_config.json') as TokenizerConfig;
    let templateText: string | undefined;
    if (chatTemplateFile) {
      if (!existsSync(chatTemplateFile)) throw new RlstreamError('TOKENIZER', `model.chat_template: ${chatTemplateFile} not found (a Jinja file, relative to the config file)`);
      templateText = readFileSync(chatTemplateFile, 'utf8');
    } else if (typeof config.chat_template === 'string') templateText = config.chat_template;
    else if (Array.isArray(config.chat_template)) {
      templateText = (config.chat_template.find((t) => t.name === 'default') ?? config.chat_template[0])?.template;
    }
    if (templateText === undefined && existsSync(join(dir, 'chat_template.jinja'))) templateText = readFileSync(join(dir, 'chat_template.jinja'), 'utf8');
    if (templateText === undefined) throw new RlstreamError('TOKENIZER', `no chat_template in ${join(dir, 'tokenizer_config.json')} nor chat_template.jinja`);
    let tokenizer: Tokenizer;
    try {
      tokenizer = new Tokenizer(tokJson, config);
    } catch (cause) {
      throw new RlstreamError('TOKENIZER', `tokenizer.json of ${dir} cannot be loaded: ${(cause as Error).message}`, { cause });
    }
    return new ChatTokenizer(tokenizer, config, templateText, dir, tokJson as { normalizer?: unknown; model?: unknown });
  }

  /** Token ids of a text. Special tokens written in the text (e.g. <|im_start|>) map to their ids. */
  encode(text: string): number[] {
    return this.segments ? this.segments.encode(text) : this.encodeUncached(text);
  }

  /** The library's encoding, without the segment cache (the reference the cache is checked against). */
  encodeUncached(text: string): number[] {
    // add_special_tokens=false: chat templates already spell BOS and friends.
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  /** Segment-cache statistics (hits, misses, entries), or null when encoding is not segmented. */
  encodeCacheStats(): { hits: number; misses: number; entries: number } | null {
    return this.segments ? this.segments.stats() : null;
  }

  decode(ids: readonly number[], options: { skipSpecialTokens?: boolean } = {}): string {
    if (ids.length === 0) return ''; // the library refuses an empty list
    return this.tokenizer.decode(ids as number[], { skip_special_tokens: options.skipSpecialTokens ?? false, clean_up_tokenization_spaces: false });
  }

  tokenId(token: string): number | undefined {
    return this.tokenizer.token_to_id(token);
  }

  isSpecial(id: number): boolean {
    return this.specialIds.has(id);
  }

  /**
   * decode(ids, {skipSpecialTokens: true}) when `bodyText` = decode(body) is already known for a `body`
   * that is `ids` less its last token: if that last token is the only one skipping drops, the decoder
   * sees exactly `body` and the result is `bodyText` (saves a decode per generated turn).
   */
  decodeSkippingSpecial(ids: readonly number[], body: readonly number[], bodyText: string): string {
    if (!this.skipIsFilterOnly || body.length !== ids.length - 1 || !this.skippedIds.has(ids[ids.length - 1]!)) return this.decode(ids, { skipSpecialTokens: true });
    for (let i = 0; i < body.length; i++) if (body[i] !== ids[i] || this.skippedIds.has(body[i]!)) return this.decode(ids, { skipSpecialTokens: true });
    return bodyText;
  }

  /** The chat template applied to messages (text, not tokens). */
  render(messages: readonly ChatMessage[] | readonly Record<string, unknown>[], options: RenderOptions = {}): string {
    try {
      return this.template.render({
        messages,
        tools: options.tools && options.tools.length > 0 ? options.tools : undefined,
        add_generation_prompt: options.addGenerationPrompt ?? false,
        bos_token: this.bosToken ?? '',
        eos_token: this.eosToken ?? '',
        ...options.templateKwargs,
      });
    } catch (cause) {
      throw new RlstreamError('TOKENIZER', `chat template failed to render ${messages.length} message(s): ${(cause as Error).message}`, { cause });
    }
  }

  /** render() then encode(). */
  apply(messages: readonly ChatMessage[], options: RenderOptions = {}): number[] {
    return this.encode(this.render(messages, options));
  }
}
