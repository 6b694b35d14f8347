// Builds the calculator task's tokenizer in Hugging Face's formats (tokenizer.json: byte-level BPE with
// single-digit pre-tokenization, as Qwen2 does; tokenizer_config.json: special tokens and the Jinja chat
// template), trained on rendered demonstrations. Run: npx tsx examples/calculator/make-tokenizer.ts
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Template } from '@huggingface/jinja';
import { EASY, HARD, problems, take } from './task.ts';
import { CALCULATOR_TOOL, demonstration } from './conversation.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
export const TOKENIZER_DIR = join(HERE, 'tokenizer');
const VOCAB_SIZE = 512;

/** Tokens the model must emit or see whole; tool tags are not "special" so decoding keeps them. */
const ADDED = [
  { content: '<|endoftext|>', special: true },
  { content: '<|im_start|>', special: true },
  { content: '<|im_end|>', special: true },
  { content: '<tool_call>', special: false },
  { content: '</tool_call>', special: false },
  { content: '<tool_response>', special: false },
  { content: '</tool_response>', special: false },
];

// Qwen2-style split: letters with one leading non-letter, each digit alone, punctuation runs, whitespace.
const SPLIT = "'s|'t|'re|'ve|'m|'ll|'d|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/** GPT-2's reversible map from bytes to printable characters. */
function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let i = 33; i <= 126; i++) bs.push(i);
  for (let i = 161; i <= 172; i++) bs.push(i);
  for (let i = 174; i <= 255; i++) bs.push(i);
  const map: string[] = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (bs.includes(b)) map[b] = String.fromCharCode(b);
    else map[b] = String.fromCharCode(256 + n++);
  }
  return map;
}

function trainBpe(words: Map<string, number>, alphabet: string[], targetMerges: number): string[][] {
  const seqs = [...words.entries()].map(([w, c]) => ({ sym: [...w], c }));
  const merges: string[][] = [];
  while (merges.length < targetMerges) {
    const counts = new Map<string, number>();
    for (const { sym, c } of seqs) for (let i = 0; i + 1 < sym.length; i++) {
      const k = sym[i] + '\u0000' + sym[i + 1];
      counts.set(k, (counts.get(k) ?? 0) + c);
    }
    let best = '';
    let bestCount = 1;
    for (const [k, c] of counts) if (c > bestCount || (c === bestCount && best !== '' && k < best)) [best, bestCount] = [k, c];
    if (best === '') break;
    const [a, b] = best.split('\u0000') as [string, string];
    merges.push([a, b]);
    for (const s of seqs) {
      const out: string[] = [];
      for (let i = 0; i < s.sym.length; i++) {
        if (i + 1 < s.sym.length && s.sym[i] === a && s.sym[i + 1] === b) { out.push(a + b); i++; } else out.push(s.sym[i]!);
      }
      s.sym = out;
    }
  }
  void alphabet;
  return merges;
}

export function makeTokenizer(): void {
  const chatTemplate = readFileSync(join(HERE, 'chat-template.jinja'), 'utf8');
  const template = new Template(chatTemplate);
  const corpus: string[] = [];
  for (const p of [...take(problems(7, 'train', EASY), 1500), ...take(problems(8, 'train', HARD), 1500)]) {
    corpus.push(template.render({ messages: demonstration(p), tools: [CALCULATOR_TOOL], add_generation_prompt: false }));
  }
  const specials = new RegExp(ADDED.map((t) => t.content.replace(/[|[\]\\/<>]/g, (m) => '\\' + m)).join('|'), 'g');
  const split = new RegExp(SPLIT, 'gu');
  const b2u = bytesToUnicode();
  const words = new Map<string, number>();
  for (const text of corpus) for (const piece of text.split(specials)) for (const m of piece.matchAll(split)) {
    const w = [...Buffer.from(m[0], 'utf8')].map((b) => b2u[b]).join('');
    words.set(w, (words.get(w) ?? 0) + 1);
  }
  const alphabet = b2u.slice();
  const merges = trainBpe(words, alphabet, VOCAB_SIZE - ADDED.length - 256);
  const vocab: Record<string, number> = {};
  for (const ch of [...alphabet].sort()) vocab[ch] = Object.keys(vocab).length;
  for (const [a, b] of merges) if (vocab[`${a}${b}`] === undefined) vocab[`${a}${b}`] = Object.keys(vocab).length;
  const base = Object.keys(vocab).length;
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: ADDED.map((t, i) => ({ id: base + i, content: t.content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: t.special })),
    normalizer: { type: 'NFC' },
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: SPLIT }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
      ],
    },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
  };
  const config = {
    tokenizer_class: 'PreTrainedTokenizerFast',
    model_max_length: 512,
    bos_token: null,
    eos_token: '<|im_end|>',
    pad_token: '<|endoftext|>',
    unk_token: null,
    add_bos_token: false,
    added_tokens_decoder: Object.fromEntries(tokenizer.added_tokens.map((t) => [String(t.id), { content: t.content, special: t.special, lstrip: false, rstrip: false, normalized: false, single_word: false }])),
    chat_template: chatTemplate,
  };
  mkdirSync(TOKENIZER_DIR, { recursive: true });
  writeFileSync(join(TOKENIZER_DIR, 'tokenizer.json'), JSON.stringify(tokenizer, null, 1) + '\n');
  writeFileSync(join(TOKENIZER_DIR, 'tokenizer_config.json'), JSON.stringify(config, null, 2) + '\n');
  console.log(`wrote ${TOKENIZER_DIR}: vocab ${base + ADDED.length} (${merges.length} merges)`);
}

if (import.meta.url === `file://${process.argv[1]}`) makeTokenizer();
