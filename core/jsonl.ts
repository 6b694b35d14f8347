// The one JSONL reader: a byte stream in, one item per non-blank line out, either the line's JSON object or why
// the line is bad, always with its 1-based line number. The offline commands (score, advantage, tokenize) report
// each bad line and go on (BadLines); files read whole (dataset rows, preprocess input) stop at the first one
// (readJsonlFile).
// Lines are decoded as strict UTF-8: a malformed byte sequence would otherwise become U+FFFD and be scored,
// tokenized or estimated as if the input had said so.
import { createReadStream } from 'node:fs';
import { RlstreamError } from './errors.ts';

export type JsonlItem = { line: number; value: Record<string, unknown>; error?: undefined } | { line: number; error: string; value?: undefined };

const NEWLINE = 0x0a;

function parseLine(bytes: Uint8Array, line: number, decoder: TextDecoder): JsonlItem | null {
  let end = bytes.length;
  if (end > 0 && bytes[end - 1] === 0x0d) end--;
  let text: string;
  try {
    text = decoder.decode(bytes.subarray(0, end));
  } catch {
    return { line, error: 'not valid UTF-8' };
  }
  if (text.trim() === '') return null;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return { line, error: `not JSON (${(err as Error).message})` };
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return { line, error: 'expected a JSON object' };
  return { line, value: value as Record<string, unknown> };
}

/** Every non-blank line of a JSONL byte stream, parsed; a byte-order mark at the start is skipped. */
export async function* readJsonl(input: AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>): AsyncGenerator<JsonlItem> {
  const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false });
  let pending: Uint8Array[] = [];
  let line = 0;
  for await (const chunk of input) {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : chunk;
    let start = 0;
    for (let i = bytes.indexOf(NEWLINE); i >= 0; i = bytes.indexOf(NEWLINE, start)) {
      pending.push(bytes.subarray(start, i));
      const item = parseLine(pending.length === 1 ? pending[0]! : Buffer.concat(pending), ++line, decoder);
      pending = [];
      start = i + 1;
      if (item) yield item;
    }
    if (start < bytes.length) pending.push(bytes.slice(start));
  }
  if (pending.length > 0) {
    const item = parseLine(Buffer.concat(pending), ++line, decoder);
    if (item) yield item;
  }
}

/**
 * Every JSON object of the JSONL file at `path`, with where it stands (`<path> line <n>`) for the caller's own
 * errors; an unreadable file or the first bad line is INPUT_INVALID naming it.
 */
export async function* readJsonlFile(path: string): AsyncGenerator<{ value: Record<string, unknown>; where: string }> {
  const input = createReadStream(path);
  await new Promise<void>((resolve, reject) => {
    input.once('open', () => resolve());
    input.once('error', (e) => reject(new RlstreamError('INPUT_INVALID', `cannot read ${path}: ${e.message}`)));
  });
  for await (const item of readJsonl(input)) {
    const where = `${path} line ${item.line}`;
    if (item.error !== undefined) throw new RlstreamError('INPUT_INVALID', `${where}: ${item.error}`);
    yield { value: item.value, where };
  }
}

/**
 * The bad-line policy every offline command shares: each bad line is reported on stderr with its number as it
 * is found, good lines go on, and the command exits 1 at the end when any line was bad.
 */
export class BadLines {
  count = 0;
  lines = 0;

  constructor(
    private readonly command: string,
    private readonly write: (text: string) => void = (t) => void process.stderr.write(t),
  ) {}

  report(line: number, message: string): void {
    this.count++;
    this.write(`rlstream ${this.command}: line ${line}: ${message}\n`);
  }

  /** Note how many input lines were seen (for the summary). */
  seen(line: number): void {
    if (line > this.lines) this.lines = line;
  }

  /** The summary line and exit code 1 when any line was bad. */
  finish(): void {
    if (this.count === 0) return;
    this.write(`rlstream ${this.command}: ${this.count} bad line(s) of ${this.lines}; the other lines were written\n`);
    process.exitCode = 1;
  }
}
