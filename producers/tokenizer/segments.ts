// Encoding by added-token segments with a cache: Hugging Face tokenizers split a text at added tokens
// (<|im_start|>, <|im_end|>, ...) before normalising, pre-tokenising and running the model on each piece,
// so a text's ids are the concatenation of the ids of its pieces. Chat-template renderings repeat most
// pieces (the system prompt with its tools, "<|im_end|>\n", "<|im_start|>assistant\n"), so each piece is
// encoded once and reused; only new text (a tool result, a user message) is run through BPE.
import type { Tokenizer } from '@huggingface/tokenizers';

/** Texts the split is checked on at load (the cache is off when any of them encodes differently). */
const SELF_CHECK = [
  'plain text, no added tokens: 48/2 = 24 .  \n\n  tabs\tand ünïcödé 你好',
  '{A}system\nYou are helpful.{B}\n{A}user\nWhat is 48/2?{B}\n{A}assistant\n',
  '{A}{B}{A}  spaces around {B}  \n{A}\n',
  'text before {A}x{B}{B}trailing',
];

export class SegmentEncoder {
  private readonly cache = new Map<string, readonly number[]>();
  private chars = 0;
  private hits = 0;
  private misses = 0;

  private constructor(
    /** Matches any added token the library splits on before normalising (longest first). */
    private readonly splitter: RegExp,
    private readonly encodePiece: (text: string) => number[],
    private readonly maxEntries: number,
    private readonly maxChars: number,
  ) {}

  /**
   * A segment encoder for a tokenizer, or null when splitting would not reproduce the library exactly:
   * added tokens that strip whitespace next to them (lstrip / rstrip reach across a piece boundary),
   * or a self-check text that encodes differently split and whole.
   */
  static create(tokenizer: Tokenizer, hasNormalizer: boolean, encode: (text: string) => number[], maxEntries = 16_384, maxChars = 8 << 20): SegmentEncoder | null {
    const added = [...tokenizer.get_added_tokens_decoder().values()];
    if (added.length === 0) return null;
    if (added.some((t) => t.lstrip || t.rstrip)) return null;
    // The library splits the raw text on added tokens that are not normalised (all of them when there
    // is no normalizer); normalised ones are matched inside each piece, which the piece's encoding does too.
    const raw = added.filter((t) => !(t.normalized && hasNormalizer)).map((t) => t.content);
    if (raw.length === 0) return null;
    // Leftmost match, longest alternative first: the library's trie walk picks the same token.
    raw.sort((a, b) => b.length - a.length);
    const splitter = new RegExp(raw.map((c) => c.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'), 'g');
    const seg = new SegmentEncoder(splitter, encode, maxEntries, maxChars);
    const specials = added.filter((t) => t.special).map((t) => t.content);
    const a = specials[0] ?? raw[0]!;
    const b = specials[1] ?? a;
    for (const t of SELF_CHECK) {
      const text = t.replaceAll('{A}', a).replaceAll('{B}', b);
      const whole = encode(text);
      const split = seg.encode(text);
      if (whole.length !== split.length || whole.some((id, i) => id !== split[i])) return null;
    }
    seg.cache.clear();
    seg.chars = 0;
    seg.hits = 0;
    seg.misses = 0;
    return seg;
  }

  /**
   * Ids of a text: the pieces are the text before the first added token, then each added token with the
   * text up to the next one. Inside a piece the text after the token is a later section, as it is in
   * the whole text (pre-tokenizers only tell the first section from the others).
   */
  encode(text: string): number[] {
    const out: number[] = [];
    const re = this.splitter;
    re.lastIndex = 0;
    let start = 0;
    let m: RegExpExecArray | null;
    while ((m = re.exec(text)) !== null) {
      if (m.index > start) this.piece(text.slice(start, m.index), out);
      start = m.index;
      // Advance past this token: the piece runs from it to the next match.
      re.lastIndex = m.index + m[0].length;
      const next = re.exec(text);
      const end = next === null ? text.length : next.index;
      this.piece(text.slice(start, end), out);
      start = end;
      if (next === null) break;
      re.lastIndex = end;
    }
    if (start < text.length) this.piece(text.slice(start), out);
    return out;
  }

  private piece(text: string, out: number[]): void {
    let ids = this.cache.get(text);
    if (ids === undefined) {
      this.misses++;
      ids = this.encodePiece(text);
      if (text.length <= this.maxChars / 16) {
        // FIFO eviction: cheap, and a popular piece evicted is simply encoded again once.
        while (this.cache.size >= this.maxEntries || (this.chars + text.length > this.maxChars && this.cache.size > 0)) {
          const oldest = this.cache.keys().next().value!;
          this.chars -= oldest.length;
          this.cache.delete(oldest);
        }
        this.cache.set(text, ids);
        this.chars += text.length;
      }
    } else this.hits++;
    for (let i = 0; i < ids.length; i++) out.push(ids[i]!);
  }

  stats(): { hits: number; misses: number; entries: number } {
    return { hits: this.hits, misses: this.misses, entries: this.cache.size };
  }
}
