// SQL literal escaping and typed placeholder substitution. ClickHouse 18.16 has no query parameters, so every
// user value reaches SQL through here: quoted and escaped as a ClickHouse literal, or validated as a number.
import { RlstreamError } from '../errors.ts';

/** A ClickHouse string literal that reads back as exactly `value` (both 18.16 and 26.x). */
export function quoteString(value: string): string {
  let out = "'";
  for (const ch of value) {
    switch (ch) {
      // Backslash is an escape character inside ClickHouse literals, so it is escaped first of all.
      case '\\': out += '\\\\'; break;
      case "'": out += "\\'"; break;
      case '\n': out += '\\n'; break;
      case '\r': out += '\\r'; break;
      case '\t': out += '\\t'; break;
      case '\0': out += '\\0'; break;
      default: {
        const code = ch.codePointAt(0)!;
        // Other control characters as \xHH: a raw control byte in a query is legal but invisible in logs.
        out += code < 0x20 || code === 0x7f ? `\\x${code.toString(16).padStart(2, '0')}` : ch;
      }
    }
  }
  return out + "'";
}

/** A backquoted identifier; only plain names are accepted (table and column names are ours, not users'). */
export function quoteIdent(name: string): string {
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new RlstreamError('INPUT_INVALID', `invalid SQL identifier ${JSON.stringify(name)}`);
  return '`' + name + '`';
}

export type ParamType = 'String' | 'Int64' | 'UInt64' | 'Float64';

const INT = /^-?\d{1,20}$/;

/** One value as a literal of the given type; throws INPUT_INVALID on anything that is not of that type. */
export function literal(type: ParamType, value: unknown, name = 'value'): string {
  if (type === 'String') {
    if (typeof value !== 'string' && typeof value !== 'number') throw new RlstreamError('INPUT_INVALID', `parameter ${name} must be a string`);
    return quoteString(String(value));
  }
  const text = typeof value === 'number' ? String(value) : typeof value === 'string' ? value.trim() : '';
  if (type === 'Float64') {
    const n = Number(text);
    if (text === '' || !Number.isFinite(n)) throw new RlstreamError('INPUT_INVALID', `parameter ${name} must be a finite number, got ${JSON.stringify(value)}`);
    return String(n);
  }
  if (!INT.test(text)) throw new RlstreamError('INPUT_INVALID', `parameter ${name} must be an integer, got ${JSON.stringify(value)}`);
  if (type === 'UInt64' && text.startsWith('-')) throw new RlstreamError('INPUT_INVALID', `parameter ${name} must not be negative, got ${text}`);
  // BigInt keeps 64-bit values exact. A bare literal (no cast): 18.16 accepts only numbers in LIMIT.
  const big = BigInt(text);
  const limit = type === 'UInt64' ? (1n << 64n) - 1n : (1n << 63n) - 1n;
  if (big > limit || big < -(1n << 63n)) throw new RlstreamError('INPUT_INVALID', `parameter ${name} is out of range for ${type}`);
  return big.toString();
}

const PLACEHOLDER = /\{([A-Za-z_][A-Za-z0-9_]*):(String|Int64|UInt64|Float64)\}/g;

/** Names and types of the `{name:Type}` placeholders in a template, in order of first use. */
export function placeholders(template: string): { name: string; type: ParamType }[] {
  const seen = new Map<string, ParamType>();
  for (const m of template.matchAll(PLACEHOLDER)) if (!seen.has(m[1]!)) seen.set(m[1]!, m[2] as ParamType);
  return [...seen].map(([name, type]) => ({ name, type }));
}

/**
 * Substitute `{name:Type}` placeholders (the syntax of ClickHouse query parameters) with escaped literals,
 * so the same template runs on servers without query parameters. Every placeholder needs a value.
 */
export function bind(template: string, params: Record<string, unknown>): string {
  return template.replace(PLACEHOLDER, (_m, name: string, type: ParamType) => {
    if (!(name in params) || params[name] === undefined) throw new RlstreamError('INPUT_INVALID', `missing parameter ${name}`);
    return literal(type, params[name], name);
  });
}
