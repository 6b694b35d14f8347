// Bearer-token authentication and the two roles. Tokens are kept only as sha256 digests; a presented token
// is hashed and compared against every stored digest with timingSafeEqual (no early exit), so neither the
// comparison nor the loop leaks how much of a token matched or which entry it was.
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { RlstreamError } from '../errors.ts';
import { takeFromEnvironment } from './environ.ts';

export type Role = 'read' | 'control';
/** What a route demands: public routes (health, readiness, static pages) need no token. */
export type Access = 'public' | Role;

export interface TokenSpec {
  token: string;
  role: Role;
  /** Shown in logs and in Control events' issued_by instead of the token. */
  name?: string;
}

interface StoredToken {
  digest: Buffer;
  role: Role;
  name: string;
}

export interface Principal {
  role: Role;
  name: string;
}

const MIN_TOKEN_LENGTH = 16;

function digest(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest();
}

export class TokenStore {
  private readonly tokens: StoredToken[];

  constructor(specs: TokenSpec[]) {
    this.tokens = specs.map((s, i) => {
      if (s.role !== 'read' && s.role !== 'control') throw new RlstreamError('CONFIG_INVALID', `admin token #${i + 1}: role must be read or control, got ${String(s.role)}`);
      if (typeof s.token !== 'string' || s.token.length < MIN_TOKEN_LENGTH) {
        throw new RlstreamError('CONFIG_INVALID', `admin token #${i + 1} (${s.role}) is shorter than ${MIN_TOKEN_LENGTH} characters`);
      }
      return { digest: digest(s.token), role: s.role, name: s.name ?? `${s.role}#${i + 1}` };
    });
  }

  get size(): number {
    return this.tokens.length;
  }

  /** The principal a token belongs to, or null. Always hashes once and compares against every entry. */
  verify(token: string): Principal | null {
    const d = digest(token);
    let found: StoredToken | null = null;
    for (const t of this.tokens) {
      if (timingSafeEqual(d, t.digest) && found === null) found = t;
    }
    return found ? { role: found.role, name: found.name } : null;
  }
}

/** Whether a principal's role satisfies what a route demands (control includes read). */
export function allows(principal: Principal, access: Role): boolean {
  return access === 'read' || principal.role === 'control';
}

/**
 * Parses RLSTREAM_ADMIN_TOKENS: comma-separated entries `role:token` (role read or control); a bare token is a
 * read token, so a token pasted without thought can never stop a run.
 */
export function parseTokenList(text: string, source = 'RLSTREAM_ADMIN_TOKENS'): TokenSpec[] {
  const specs: TokenSpec[] = [];
  for (const [i, raw] of text.split(',').entries()) {
    const entry = raw.trim();
    if (entry === '') continue;
    const colon = entry.indexOf(':');
    const role = colon > 0 ? entry.slice(0, colon) : 'read';
    const token = colon > 0 ? entry.slice(colon + 1) : entry;
    if (role !== 'read' && role !== 'control') throw new RlstreamError('CONFIG_INVALID', `${source} entry ${i + 1}: role must be read or control, got ${role}`);
    specs.push({ token, role, name: `${role}#${specs.length + 1}` });
  }
  return specs;
}

export const TOKENS_VARIABLE = 'RLSTREAM_ADMIN_TOKENS';
/** The file of tokens (the preferred way: the tokens then never pass through an environment). */
export const TOKENS_FILE_VARIABLE = 'RLSTREAM_ADMIN_TOKENS_FILE';

/**
 * The tokens of a token file: `role:token` entries (as RLSTREAM_ADMIN_TOKENS), one a line or comma-separated,
 * `#` comments. The file must be its owner's alone (mode 0600 or stricter), as ssh demands of a key.
 */
export function readTokenFile(path: string, what = '--token-file'): TokenSpec[] {
  let mode: number;
  let text: string;
  try {
    const st = statSync(path);
    if (!st.isFile()) throw new RlstreamError('CONFIG_INVALID', `${what} ${path} is not a file`);
    mode = st.mode & 0o777;
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if (err instanceof RlstreamError) throw err;
    throw new RlstreamError('CONFIG_INVALID', `${what} ${path} cannot be read: ${(err as Error).message}`);
  }
  if ((mode & 0o077) !== 0) {
    throw new RlstreamError('CONFIG_INVALID', `${what} ${path} is readable or writable by others (mode ${mode.toString(8).padStart(4, '0')}): chmod 600 ${path}`);
  }
  const entries = text.split('\n').map((l) => l.replace(/#.*$/, '').trim()).filter((l) => l !== '');
  const specs = parseTokenList(entries.join(','), `${what} ${path}`);
  if (specs.length === 0) throw new RlstreamError('CONFIG_INVALID', `${what} ${path} holds no token`);
  return specs;
}

/**
 * The tokens of RLSTREAM_ADMIN_TOKENS and of the file RLSTREAM_ADMIN_TOKENS_FILE names, in `env`. From
 * process.env (the default) both are removed as they are read (core/auth/environ.ts; the CLI removes them before
 * anything else runs: cli/secrets-first.ts), so no token stays readable in this process's environment.
 */
export function envTokens(env?: Record<string, string | undefined>): TokenSpec[] {
  const take = (name: string) => (env ? env[name] : takeFromEnvironment(name));
  const file = take(TOKENS_FILE_VARIABLE);
  return [...parseTokenList(take(TOKENS_VARIABLE) ?? ''), ...(file ? readTokenFile(file, TOKENS_FILE_VARIABLE) : [])];
}

/** The token of an `Authorization: Bearer <token>` header, or null. */
export function bearerToken(header: string | undefined): string | null {
  if (!header) return null;
  const m = /^Bearer[ \t]+([^\s]+)[ \t]*$/i.exec(header);
  return m ? m[1]! : null;
}

/**
 * Failed authentications per client address in a fixed window. The server checks it before it hashes a
 * presented token, so a client guessing tokens is answered 429 at no cost once it is over the limit.
 */
export class AuthFailureLimiter {
  private readonly failures = new Map<string, { count: number; resetAt: number }>();

  constructor(
    private readonly max: number,
    private readonly windowMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** Milliseconds until the client may try again, or 0 when it may try now. */
  retryAfterMs(client: string): number {
    const f = this.failures.get(client);
    if (!f) return 0;
    const left = f.resetAt - this.now();
    if (left <= 0) {
      this.failures.delete(client);
      return 0;
    }
    return f.count >= this.max ? left : 0;
  }

  fail(client: string): void {
    const t = this.now();
    let f = this.failures.get(client);
    if (!f || f.resetAt <= t) {
      // Expired entries are dropped when the table grows, so many clients cannot grow it without bound.
      if (this.failures.size >= 10_000) for (const [k, v] of this.failures) if (v.resetAt <= t) this.failures.delete(k);
      f = { count: 0, resetAt: t + this.windowMs };
      this.failures.set(client, f);
    }
    f.count++;
  }
}
