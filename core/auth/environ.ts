// Takes a secret out of this process's environment. The admin server runs user SQL in the same process (chDB),
// so a token read from the environment is removed as soon as it is read: from process.env (and with it from
// what child processes inherit) and from the environment block the kernel shows as /proc/self/environ, which
// keeps the process's initial variables whatever unsetenv() does. That block is overwritten in place through
// /proc/self/mem; nothing points into the removed entry any more once unsetenv() has dropped it.
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';

/** env_start and env_end of /proc/self/stat (fields 50 and 51, counted after the parenthesised name). */
function environBounds(): { start: number; end: number } | null {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const start = Number(fields[50 - 3]);
  const end = Number(fields[51 - 3]);
  return Number.isSafeInteger(start) && Number.isSafeInteger(end) && end > start ? { start, end } : null;
}

/** Zeroes the NAME=value entries of the initial environment block; false where that is not possible. */
function scrubInitialEnvironment(name: string): boolean {
  if (process.platform !== 'linux') return false;
  try {
    const bounds = environBounds();
    if (!bounds) return false;
    const block = readFileSync('/proc/self/environ');
    const key = Buffer.from(`${name}=`);
    const fd = openSync('/proc/self/mem', 'r+');
    try {
      for (let off = 0; off < block.length; ) {
        const nul = block.indexOf(0, off);
        const end = nul < 0 ? block.length : nul;
        if (end - off >= key.length && block.subarray(off, off + key.length).equals(key)) {
          writeSync(fd, Buffer.alloc(end - off), 0, end - off, bounds.start + off);
        }
        off = end + 1;
      }
    } finally {
      closeSync(fd);
    }
    return !readFileSync('/proc/self/environ').includes(key);
  } catch {
    return false;
  }
}

const taken = new Map<string, string>();

/**
 * The value of an environment variable, removed from the environment at once (process.env and, on Linux, the
 * initial block of /proc/self/environ). Later calls in this process return the value read first.
 */
export function takeFromEnvironment(name: string): string | undefined {
  if (taken.has(name)) return taken.get(name);
  const value = process.env[name];
  if (value === undefined) return undefined;
  taken.set(name, value);
  delete process.env[name];
  scrubInitialEnvironment(name);
  return value;
}

/** Variables that hold tokens or name their files: every rlstream process takes them out first (cli/secrets-first.ts). */
export const SECRET_VARIABLES = ['RLSTREAM_ADMIN_TOKENS', 'RLSTREAM_ADMIN_TOKENS_FILE', 'RLSTREAM_SERVE_TOKENS', 'RLSTREAM_SERVE_TOKENS_FILE', 'RLSTREAM_ADMIN_TOKEN'];

/** Takes every secret variable out of the environment (their values stay available to takeFromEnvironment). */
export function takeSecretsFromEnvironment(): void {
  for (const name of SECRET_VARIABLES) takeFromEnvironment(name);
}
