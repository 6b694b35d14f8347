// Tool-call parsers: find the calls in an assistant turn's text (decoded with its special tokens), by the names
// vLLM and verl give the formats: `hermes` (Qwen2.5, Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
// any number per turn), `llama3_json` (Llama 3.1+: the turn is a JSON object {"name": ..., "parameters": {...}},
// optionally after <|python_tag|>, several separated by ';'), `mistral` ([TOOL_CALLS] then a JSON list of
// {"name", "arguments"}, or Mistral's newer [TOOL_CALLS]name[ARGS]{...}). A call that cannot be decoded is reported
// as an error (the agent answers it with an error message) instead of dropped. The registry maps each model family
// to its format (toolParserForFamily), unless the chat template in use spells another's marker (toolParserFor);
// rollout.tool_parser overrides both.
import type { ModelFamily } from '../../core/weights/model-config.ts';

export interface ParsedToolCall {
  name: string;
  /** The arguments as JSON text (objects re-serialised; strings kept as the model wrote them). */
  argumentsJson: string;
}

export interface ToolParseResult {
  /** The text outside the tool-call blocks. */
  content: string;
  calls: ParsedToolCall[];
  /** One message per call that failed to decode. */
  errors: string[];
}

export interface ToolParser {
  readonly name: string;
  parse(text: string): ToolParseResult;
  /**
   * The text that opens a call in this format, for a caller that constrains a turn to be a call (OpenAI's
   * tool_choice): with a name, everything up to the arguments' value (what follows is the policy's to write);
   * with null, everything up to the name's first character. Absent: the format cannot be forced.
   */
  callPrefix?(name: string | null): string;
  /**
   * A token only this format's calls carry, as a chat template that writes them spells it: how the format in use
   * is found from the template (toolParserFor). Absent: the format has no marker of its own (Llama 3.1's bare JSON).
   */
  readonly marker?: string;
}

/** `{"name": "<name>", "<argsKey>":` as the JSON formats open a call (the name written as JSON writes it). */
function jsonCallPrefix(name: string | null, argsKey: string): string {
  return name === null ? '{"name": "' : `{"name": ${JSON.stringify(name)}, "${argsKey}":`;
}

const BLOCK = /<tool_call>([\s\S]*?)<\/tool_call>/g;

export const hermesToolParser: ToolParser = {
  name: 'hermes',
  marker: '<tool_call>',
  callPrefix: (name) => `<tool_call>\n${jsonCallPrefix(name, 'arguments')}`,
  parse(text: string): ToolParseResult {
    const calls: ParsedToolCall[] = [];
    const errors: string[] = [];
    let content = '';
    let last = 0;
    for (const m of text.matchAll(BLOCK)) {
      content += text.slice(last, m.index);
      last = m.index + m[0].length;
      const body = (m[1] ?? '').trim();
      let obj: unknown;
      try {
        obj = JSON.parse(body);
      } catch (err) {
        errors.push(`failed to decode tool call: ${(err as Error).message} in ${JSON.stringify(body.slice(0, 120))}`);
        continue;
      }
      if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
        errors.push(`failed to decode tool call: expected {"name": ..., "arguments": ...}, got ${JSON.stringify(body.slice(0, 120))}`);
        continue;
      }
      const o = obj as Record<string, unknown>;
      if (typeof o['name'] !== 'string' || o['name'] === '') {
        errors.push(`failed to decode tool call: missing "name" in ${JSON.stringify(body.slice(0, 120))}`);
        continue;
      }
      const args = o['arguments'] ?? o['parameters'] ?? {};
      calls.push({ name: o['name'], argumentsJson: typeof args === 'string' ? args : JSON.stringify(args) });
    }
    const rest = text.slice(last);
    // An opening tag without its closing tag (a cut-off or sloppy call) is a decode failure too.
    const open = rest.indexOf('<tool_call>');
    if (open >= 0) {
      errors.push(`failed to decode tool call: <tool_call> without </tool_call>`);
      content += rest.slice(0, open);
    } else content += rest;
    return { content: content.trim(), calls, errors };
  },
};

/** A call object as the JSON formats write it: a non-empty string name and object (or string) arguments. */
function callOf(obj: unknown, body: string, argsKeys: readonly string[]): ParsedToolCall | string {
  const shown = JSON.stringify(body.slice(0, 120));
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) return `failed to decode tool call: expected {"name": ..., "${argsKeys[0]}": ...}, got ${shown}`;
  const o = obj as Record<string, unknown>;
  if (typeof o['name'] !== 'string' || o['name'] === '') return `failed to decode tool call: missing "name" in ${shown}`;
  const key = argsKeys.find((k) => o[k] !== undefined);
  const args = key === undefined ? {} : o[key];
  if (args === null || (typeof args !== 'object' && typeof args !== 'string') || Array.isArray(args)) return `failed to decode tool call: "${key}" must be an object in ${shown}`;
  return { name: o['name'], argumentsJson: typeof args === 'string' ? args : JSON.stringify(args) };
}

/**
 * JSON values one after another in `text` (separated by whitespace or `sep`), each decoded by JSON.parse: the
 * values, and where decoding stopped (text.length when it did not).
 */
function jsonSequence(text: string, sep: string): { values: unknown[]; stop: number; error: string | null } {
  const values: unknown[] = [];
  let i = 0;
  for (;;) {
    while (i < text.length && (/\s/.test(text[i]!) || text[i] === sep)) i++;
    if (i >= text.length) return { values, stop: i, error: null };
    if (text[i] !== '{' && text[i] !== '[') return { values, stop: i, error: null };
    // the end of this value: the first closing bracket at depth 0 outside strings
    let depth = 0;
    let inStr = false;
    let end = -1;
    for (let j = i; j < text.length; j++) {
      const c = text[j]!;
      if (inStr) {
        if (c === '\\') j++;
        else if (c === '"') inStr = false;
      } else if (c === '"') inStr = true;
      else if (c === '{' || c === '[') depth++;
      else if (c === '}' || c === ']') {
        depth--;
        if (depth === 0) {
          end = j + 1;
          break;
        }
      }
    }
    if (end < 0) return { values, stop: i, error: `unterminated JSON in ${JSON.stringify(text.slice(i, i + 120))}` };
    try {
      values.push(JSON.parse(text.slice(i, end)));
    } catch (err) {
      return { values, stop: i, error: `${(err as Error).message} in ${JSON.stringify(text.slice(i, i + 120))}` };
    }
    i = end;
  }
}

const PYTHON_TAG = '<|python_tag|>';

export const llama3JsonToolParser: ToolParser = {
  name: 'llama3_json',
  callPrefix: (name) => jsonCallPrefix(name, 'parameters'),
  parse(text: string): ToolParseResult {
    let body = text.trim();
    const tagged = body.startsWith(PYTHON_TAG);
    if (tagged) body = body.slice(PYTHON_TAG.length).trim();
    // a turn that is not JSON is content (Llama 3.1 writes a call as the whole turn)
    if (!body.startsWith('{')) return tagged ? { content: '', calls: [], errors: [`failed to decode tool call: ${PYTHON_TAG} not followed by a JSON object`] } : { content: text.trim(), calls: [], errors: [] };
    const seq = jsonSequence(body, ';');
    const calls: ParsedToolCall[] = [];
    const errors: string[] = [];
    for (const v of seq.values) {
      const c = callOf(v, JSON.stringify(v), ['parameters', 'arguments']);
      if (typeof c === 'string') errors.push(c);
      else calls.push(c);
    }
    if (seq.error) errors.push(`failed to decode tool call: ${seq.error}`);
    else if (seq.stop < body.length) errors.push(`failed to decode tool call: text after the JSON calls: ${JSON.stringify(body.slice(seq.stop, seq.stop + 120))}`);
    return { content: '', calls, errors };
  },
};

const TOOL_CALLS = '[TOOL_CALLS]';
const ARGS = '[ARGS]';

export const mistralToolParser: ToolParser = {
  name: 'mistral',
  marker: TOOL_CALLS,
  callPrefix: (name) => `${TOOL_CALLS}[${jsonCallPrefix(name, 'arguments')}`,
  parse(text: string): ToolParseResult {
    const at = text.indexOf(TOOL_CALLS);
    if (at < 0) return { content: text.trim(), calls: [], errors: [] };
    const content = text.slice(0, at).trim();
    const calls: ParsedToolCall[] = [];
    const errors: string[] = [];
    // Mistral's newer format: [TOOL_CALLS]name[ARGS]{...}, repeated
    const parts = text.slice(at).split(TOOL_CALLS).slice(1);
    if (parts.every((p) => p.includes(ARGS) && !p.trimStart().startsWith('['))) {
      for (const p of parts) {
        const k = p.indexOf(ARGS);
        const name = p.slice(0, k).trim();
        const seq = jsonSequence(p.slice(k + ARGS.length), '');
        if (!/^[A-Za-z0-9_.-]+$/.test(name)) errors.push(`failed to decode tool call: bad function name ${JSON.stringify(name.slice(0, 60))}`);
        else if (seq.error || seq.values.length !== 1) errors.push(`failed to decode tool call: ${seq.error ?? `expected one JSON object after ${ARGS}`}`);
        else {
          const c = callOf({ name, arguments: seq.values[0] }, p, ['arguments']);
          if (typeof c === 'string') errors.push(c);
          else calls.push(c);
        }
      }
      return { content, calls, errors };
    }
    // v3: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
    const seq = jsonSequence(text.slice(at + TOOL_CALLS.length), '');
    if (seq.error) return { content, calls, errors: [`failed to decode tool call: ${seq.error}`] };
    if (seq.values.length !== 1 || !Array.isArray(seq.values[0])) return { content, calls, errors: [`failed to decode tool call: ${TOOL_CALLS} must be followed by a JSON list of calls`] };
    for (const v of seq.values[0] as unknown[]) {
      const c = callOf(v, JSON.stringify(v), ['arguments']);
      if (typeof c === 'string') errors.push(c);
      else calls.push(c);
    }
    return { content, calls, errors };
  },
};

const PARSERS = new Map<string, ToolParser>();

/** Registers a tool-call parser under its name (a user module may add one before the roles start). */
export function registerToolParser(p: ToolParser): void {
  PARSERS.set(p.name, p);
}
for (const p of [hermesToolParser, llama3JsonToolParser, mistralToolParser]) registerToolParser(p);

export function toolParser(name: string): ToolParser | undefined {
  return PARSERS.get(name);
}

export function toolParserNames(): string[] {
  return [...PARSERS.keys()];
}

/** The tool-call format each family's chat template writes (vLLM's and verl's parser names). */
export const TOOL_PARSER_BY_FAMILY: Readonly<Record<ModelFamily, string>> = Object.freeze({ llama: 'llama3_json', qwen2: 'hermes', qwen3: 'hermes', mistral: 'mistral' });

export function toolParserForFamily(family: ModelFamily | null): string {
  return family === null ? 'hermes' : TOOL_PARSER_BY_FAMILY[family];
}

/**
 * The tool-call format of the chat template in use: the one registered parser whose marker the template spells,
 * else the family's. The template decides, not the family, because a config may give its own (model.chat_template):
 * SmolLM2 is a llama, and the calculator's ChatML template for it writes Hermes' <tool_call> blocks, which the
 * family's llama3_json parser never finds (every call lost, every reward 0).
 */
export function toolParserFor(family: ModelFamily | null, templateText: string): string {
  const found = [...PARSERS.values()].filter((p) => p.marker !== undefined && templateText.includes(p.marker));
  return found.length === 1 ? found[0]!.name : toolParserForFamily(family);
}
