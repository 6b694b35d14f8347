// Tool-call parsers: find the calls in an assistant turn's text. Hermes / Qwen format is
// <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number per turn. A call that cannot be
// decoded is reported as an error (the agent answers it with an error message) instead of dropped.

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
}

const BLOCK = /<tool_call>([\s\S]*?)<\/tool_call>/g;

export const hermesToolParser: ToolParser = {
  name: 'hermes',
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

const PARSERS = new Map<string, ToolParser>([[hermesToolParser.name, hermesToolParser]]);

export function toolParser(name: string): ToolParser | undefined {
  return PARSERS.get(name);
}

export function toolParserNames(): string[] {
  return [...PARSERS.keys()];
}
