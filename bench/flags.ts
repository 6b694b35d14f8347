// The benchmarks' one flag parser: each bench declares its flags (name → kind) and its positional sizes, Node's
// util.parseArgs splits the arguments, and each kind checks its value, so a bad or unknown flag or a stray
// argument fails (FlagError: bench/main.ts prints its one line and exits 2) with the flag's name and the bench's
// flag list instead of running a long benchmark on a default. The flags several benches share are declared here
// once: --quick/--rounds (every bench on the harness's rounds) and the main job's size (async, async-parity).
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';

/** A bad command line: bench/main.ts prints the message alone (no stack) and exits 2. */
export class FlagError extends Error {
  override name = 'FlagError';
}

export interface Flag<T> {
  /** false: a switch (`--keep`), true: takes a value (`--steps 8` or `--steps=8`). */
  takesValue: boolean;
  /** The value's placeholder in the flag list. */
  hint: string;
  /** Left out of the flag list (a replaced flag). */
  hidden?: boolean;
  parse(raw: string, flag: string): T;
}

function toInt(flag: string, raw: string, min: number, max = Infinity): number {
  const x = Number(raw);
  if (raw.trim() === '' || !Number.isInteger(x) || x < min || x > max) throw new Error(`${flag} must be an integer ${max === Infinity ? `>= ${min}` : `in ${min}..${max}`} (got ${JSON.stringify(raw)})`);
  return x;
}

/** An integer of at least `min` (and at most `max`). */
export const int = (min: number, max = Infinity): Flag<number> => ({ takesValue: true, hint: 'N', parse: (raw, flag) => toInt(flag, raw, min, max) });

/** Comma-separated integers of at least `min` (`--bounds 0,2,4`). */
export const ints = (min: number): Flag<number[]> => ({ takesValue: true, hint: 'N,N,…', parse: (raw, flag) => raw.split(',').map((x) => toInt(flag, x, min)) });

/** A switch: present or not. */
export const bool: Flag<boolean> = { takesValue: false, hint: '', parse: () => true };

/** One of `choices`. */
export const choice = <C extends string>(choices: readonly C[]): Flag<C> => ({
  takesValue: true,
  hint: choices.join('|'),
  parse: (raw, flag) => {
    if (!(choices as readonly string[]).includes(raw)) throw new Error(`${flag} must be one of ${choices.join(', ')} (got ${JSON.stringify(raw)})`);
    return raw as C;
  },
});

/** Comma-separated names, at least one; each one of `known` where given. */
export const names = (known?: readonly string[]): Flag<string[]> => ({
  takesValue: true,
  hint: 'a,b,…',
  parse: (raw, flag) => {
    const xs = raw.split(',').filter(Boolean);
    if (xs.length === 0) throw new Error(`${flag} needs at least one name`);
    for (const x of xs) if (known && !known.includes(x)) throw new Error(`${flag}: unknown ${JSON.stringify(x)} (known: ${known.join(', ')})`);
    return xs;
  },
});

/** A file path, resolved against the working directory. */
export const path: Flag<string> = { takesValue: true, hint: 'FILE', parse: (raw) => resolve(raw) };

/** A flag the bench no longer takes: giving it fails, naming what replaced it. */
export const replaced = (by: string, takesValue = true): Flag<never> => ({
  takesValue,
  hint: '',
  hidden: true,
  parse: (_raw, flag) => {
    throw new Error(`${flag} is no longer taken: ${by}`);
  },
});

type Flags = Record<string, Flag<unknown>>;
export type FlagValues<S extends Flags> = { [K in keyof S]?: S[K] extends Flag<infer T> ? T : never };

/** The flag list printed with an error: `--steps N --keep …`. */
export function usage(flags: Flags): string {
  return Object.entries(flags)
    .filter(([, f]) => !f.hidden)
    .map(([name, f]) => (f.takesValue ? `--${name} ${f.hint}` : `--${name}`))
    .join(' ');
}

/** The flag list printed with an error, positional sizes first: `[records] [batch] --rounds N …`. */
function usageWith(flags: Flags, positionals: readonly (readonly [string, Flag<unknown>])[]): string {
  return [...positionals.map(([name]) => `[${name}]`), usage(flags)].filter(Boolean).join(' ');
}

/**
 * Parse `args` against `flags` (`--name value`, `--name=value`, switches) and up to `positionals.length` bare
 * arguments, each named and checked by its kind (`log 20000 100`: records, batch). A flag or position not given is
 * absent from `values` (the bench picks its default, which may depend on --quick). An unknown flag, an argument
 * past the declared positions, a missing or bad value: FlagError naming it, with the flag list.
 */
export function parseFlags<S extends Flags, P extends string = never>(
  args: string[],
  flags: S,
  opts: { positionals?: readonly (readonly [P, Flag<number>])[] } = {},
): { values: FlagValues<S>; positional: { [K in P]?: number } } {
  const positionals = opts.positionals ?? [];
  const list = usageWith(flags, positionals);
  const options = Object.fromEntries(Object.entries(flags).map(([name, f]) => [name, { type: f.takesValue ? ('string' as const) : ('boolean' as const) }]));
  let tokens;
  try {
    ({ tokens } = parseArgs({ args, options, strict: true, allowPositionals: positionals.length > 0, tokens: true }));
  } catch (e) {
    const err = e as Error & { code?: string };
    if (!err.code?.startsWith('ERR_PARSE_ARGS')) throw e;
    throw new FlagError(`${err.message.split(/\.\s/)[0]} (flags: ${list})`);
  }
  const checked = <T>(flag: Flag<T>, raw: string, name: string): T => {
    try {
      return flag.parse(raw, name);
    } catch (e) {
      throw new FlagError(`${(e as Error).message} (flags: ${list})`);
    }
  };
  const values: Record<string, unknown> = {};
  const positional: Record<string, number> = {};
  let position = 0;
  for (const t of tokens) {
    if (t.kind === 'positional') {
      const slot = positionals[position++];
      if (!slot) throw new FlagError(`Unexpected argument '${t.value}' (flags: ${list})`);
      positional[slot[0]] = checked(slot[1], t.value, slot[0]);
      continue;
    }
    if (t.kind !== 'option') continue;
    const flag = flags[t.name]!;
    values[t.name] = flag.takesValue ? checked(flag, t.value!, `--${t.name}`) : checked(flag, '', `--${t.name}`);
  }
  return { values: values as FlagValues<S>, positional: positional as { [K in P]?: number } };
}

/** --quick (smoke size: proves the benchmark runs, its figures mean nothing) and --rounds N. */
export const ROUND_FLAGS = { quick: bool, rounds: int(1) };

/** The size of a main-job run and its trainer's threads: the benches that run the main job (async, async-parity). */
export const MAIN_JOB_FLAGS = {
  steps: int(1),
  groups: int(1),
  n: int(2),
  heldout: int(1),
  bounds: ints(0),
  'sync-threads': int(1),
  'async-threads': int(1),
  'mode-timeout': int(1),
  keep: bool,
};
