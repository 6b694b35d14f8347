// A GGUF's tokenizer metadata (tokenizer.ggml.*) as Hugging Face tokenizer.json and tokenizer_config.json.
// Byte-level BPE (tokenizer.ggml.model = "gpt2") only: the tokens are already in GPT-2's byte-to-unicode
// alphabet and the merges are "left right" pairs in rank order, so they carry over as they are. What llama.cpp
// keeps as a pre-tokenizer name (tokenizer.ggml.pre) becomes the Hugging Face pre-tokenizer it stands for.
import { RlstreamError } from '../errors.ts';
import type { GgufFile, GgufValue } from './gguf.ts';

// llama_token_type values of tokenizer.ggml.token_type (llama.cpp's llama-vocab.h).
const TOKEN_CONTROL = 3;
const TOKEN_USER_DEFINED = 4;

const BYTE_LEVEL = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };

/**
 * tokenizer.ggml.pre → Hugging Face pre_tokenizer. The names are llama.cpp's; each entry is the pre-tokenizer
 * of the Hugging Face tokenizer.json that llama.cpp's converter fingerprinted to that name (llama.cpp splits
 * with the same regexes): GPT-2's byte-level regex, and the StarCoder family's that first splits every digit.
 */
const PRE_TOKENIZERS: Record<string, (addPrefixSpace: boolean) => unknown> = {
  default: (p) => ({ ...BYTE_LEVEL, add_prefix_space: p }),
  gpt2: (p) => ({ ...BYTE_LEVEL, add_prefix_space: p }),
  smollm: (p) => digitsThenByteLevel(p),
  starcoder: (p) => digitsThenByteLevel(p),
  refact: (p) => digitsThenByteLevel(p),
  codeshell: (p) => digitsThenByteLevel(p),
};

function digitsThenByteLevel(addPrefixSpace: boolean): unknown {
  return { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, { ...BYTE_LEVEL, add_prefix_space: addPrefixSpace }] };
}

function fail(source: string, message: string): never {
  throw new RlstreamError('WEIGHTS_FORMAT', `${source}: ${message}`);
}

function stringArray(file: GgufFile, key: string): string[] {
  const v = file.get(key, 'array');
  if (v === undefined) fail(file.source, `metadata ${key} is missing`);
  if (!v.every((x) => typeof x === 'string')) fail(file.source, `metadata ${key} must be an array of strings`);
  return v as string[];
}

function optionalId(file: GgufFile, key: string, vocab: number): number | null {
  const v = file.get(key, 'number');
  if (v === undefined) return null;
  if (!Number.isInteger(v) || v < 0 || v >= vocab) fail(file.source, `metadata ${key} = ${v} is not a token id (vocabulary of ${vocab})`);
  return v;
}

export interface HfTokenizerFiles {
  /** tokenizer.json */
  tokenizer: Record<string, unknown>;
  /** tokenizer_config.json */
  config: Record<string, unknown>;
  bosTokenId: number | null;
  eosTokenId: number | null;
  padTokenId: number | null;
  /** Token strings that appear more than once; a tokenizer.json vocabulary keeps the first id of each. */
  duplicateTokens: number;
}

/** Builds tokenizer.json and tokenizer_config.json from the GGUF's tokenizer.ggml.* and tokenizer.chat_template. */
export function ggufTokenizer(file: GgufFile, options: { modelMaxLength?: number } = {}): HfTokenizerFiles {
  const model = file.get('tokenizer.ggml.model', 'string');
  if (model === undefined) fail(file.source, 'metadata tokenizer.ggml.model is missing: the file has no tokenizer');
  if (model !== 'gpt2')
    fail(file.source, `tokenizer.ggml.model is ${JSON.stringify(model)}; only byte-level BPE ("gpt2") tokenizers can be converted`);
  const pre = file.get('tokenizer.ggml.pre', 'string') ?? 'default';
  const preTokenizer = PRE_TOKENIZERS[pre];
  if (!preTokenizer)
    fail(file.source, `tokenizer.ggml.pre ${JSON.stringify(pre)} is not a known pre-tokenizer (known: ${Object.keys(PRE_TOKENIZERS).join(', ')})`);
  const tokens = stringArray(file, 'tokenizer.ggml.tokens');
  const merges = stringArray(file, 'tokenizer.ggml.merges');
  const typesRaw: GgufValue[] = file.get('tokenizer.ggml.token_type', 'array') ?? [];
  if (typesRaw.length !== 0 && typesRaw.length !== tokens.length)
    fail(file.source, `tokenizer.ggml.token_type has ${typesRaw.length} entries for ${tokens.length} tokens`);
  const types = typesRaw.map((t) => (typeof t === 'number' ? t : 1));

  const vocab: Record<string, number> = {};
  let duplicateTokens = 0;
  tokens.forEach((t, id) => {
    if (Object.hasOwn(vocab, t)) duplicateTokens++;
    else vocab[t] = id;
  });
  const pairs = merges.map((m, i): [string, string] => {
    // llama.cpp splits at the first space after the first character (a token may itself start with a space).
    const at = m.indexOf(' ', 1);
    if (at < 0) fail(file.source, `tokenizer.ggml.merges[${i}] ${JSON.stringify(m)} is not "left right"`);
    return [m.slice(0, at), m.slice(at + 1)];
  });

  const addedTokens: Record<string, unknown>[] = [];
  types.forEach((type, id) => {
    if (type !== TOKEN_CONTROL && type !== TOKEN_USER_DEFINED) return;
    addedTokens.push({ id, content: tokens[id], single_word: false, lstrip: false, rstrip: false, normalized: false, special: type === TOKEN_CONTROL });
  });

  const bos = optionalId(file, 'tokenizer.ggml.bos_token_id', tokens.length);
  const eos = optionalId(file, 'tokenizer.ggml.eos_token_id', tokens.length);
  const unk = optionalId(file, 'tokenizer.ggml.unknown_token_id', tokens.length);
  const pad = optionalId(file, 'tokenizer.ggml.padding_token_id', tokens.length);
  const addBos = file.get('tokenizer.ggml.add_bos_token', 'boolean') ?? false;
  const addEos = file.get('tokenizer.ggml.add_eos_token', 'boolean') ?? false;
  const addPrefixSpace = file.get('tokenizer.ggml.add_space_prefix', 'boolean') ?? false;
  if ((addBos && bos === null) || (addEos && eos === null))
    fail(file.source, 'tokenizer.ggml.add_bos_token / add_eos_token is set but the matching token id is missing');

  const text = (id: number | null): string | null => (id === null ? null : tokens[id]!);
  const tokenizer: Record<string, unknown> = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: preTokenizer(addPrefixSpace),
    post_processor: postProcessor(addBos ? bos : null, addEos ? eos : null, tokens),
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: text(unk),
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: pairs,
    },
  };

  const chatTemplate = file.get('tokenizer.chat_template', 'string');
  const config: Record<string, unknown> = {
    tokenizer_class: 'PreTrainedTokenizerFast',
    add_bos_token: addBos,
    add_eos_token: addEos,
    add_prefix_space: addPrefixSpace,
    bos_token: text(bos),
    eos_token: text(eos),
    unk_token: text(unk),
    pad_token: text(pad),
    clean_up_tokenization_spaces: false,
    ...(options.modelMaxLength === undefined ? {} : { model_max_length: options.modelMaxLength }),
    added_tokens_decoder: Object.fromEntries(addedTokens.map((t) => [String(t['id']), { ...t, id: undefined }])),
  };
  if (chatTemplate !== undefined) config['chat_template'] = chatTemplate;
  return { tokenizer, config, bosTokenId: bos, eosTokenId: eos, padTokenId: pad, duplicateTokens };
}

/** ByteLevel offsets handling, plus BOS/EOS around each sequence when the GGUF says llama.cpp adds them. */
function postProcessor(bos: number | null, eos: number | null, tokens: string[]): unknown {
  const byteLevel = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true };
  if (bos === null && eos === null) return byteLevel;
  const special = (id: number | null): unknown[] => (id === null ? [] : [{ SpecialToken: { id: tokens[id], type_id: 0 } }]);
  const seq = (id: 'A' | 'B', typeId: number): unknown => ({ Sequence: { id, type_id: typeId } });
  const specialTokens: Record<string, unknown> = {};
  for (const id of [bos, eos]) if (id !== null) specialTokens[tokens[id]!] = { id: tokens[id], ids: [id], tokens: [tokens[id]] };
  const template = {
    type: 'TemplateProcessing',
    single: [...special(bos), seq('A', 0), ...special(eos)],
    pair: [...special(bos), seq('A', 0), ...special(eos), ...special(bos), seq('B', 1), ...special(eos)],
    special_tokens: specialTokens,
  };
  return { type: 'Sequence', processors: [byteLevel, template] };
}
