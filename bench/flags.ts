// The benchmarks' one flag parser: each bench declares its flags (name → kind), Node's util.parseArgs splits the
// arguments, and each kind checks its value, so a bad or unknown flag fails with the flag's name and the bench's
// flag list instead of running a long benchmark on a default. The flags several benches share are declared here
// once: --quick/--rounds (every bench on the harness's rounds) and the main job's size (async, async-parity).
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';

export interface Flag<T> {
  /** false: a switch (`--keep`), true: takes a value (`--steps 8` or `--steps=8`). */
  takesValue: boolean;
  /** The value's placeholder in the flag list. */
  hint: string;
  /** Left out of the flag list (a replaced flag). */
  hidden?: boolean;
  parse(raw: string, flag: string): T;
}

function toInt(flag: string, raw: string, min: number): number {
  const x = Number(raw);
  if (raw.trim() === '' || !Number.isInteger(x) || x < min) throw new Error(`${flag} must be an integer >= ${min} (got ${JSON.stringify(raw)})`);
  return x;
}

/** An integer of at least `min`. */
export const int = (min: number): Flag<number> => ({ takesValue: true, hint: 'N', parse: (raw, flag) => toInt(flag, raw, min) });

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

/**
 * Parse `args` against `flags`. A flag not given is absent from `values` (the bench picks its default, which may
 * depend on --quick). Strict by default: an unknown flag or a stray argument fails, with the flag list.
 * `passThrough`: arguments that are not among `flags` (another bench's flags, positional sizes) are returned in
 * `rest`, in order, for the bench to read.
 */
export function parseFlags<S extends Flags>(args: string[], flags: S, opts: { passThrough?: boolean } = {}): { values: FlagValues<S>; rest: string[] } {
  const options = Object.fromEntries(Object.entries(flags).map(([name, f]) => [name, { type: f.takesValue ? ('string' as const) : ('boolean' as const) }]));
  let tokens;
  try {
    ({ tokens } = parseArgs({ args, options, strict: !opts.passThrough, allowPositionals: opts.passThrough === true, tokens: true }));
  } catch (e) {
    const err = e as Error & { code?: string };
    if (!err.code?.startsWith('ERR_PARSE_ARGS')) throw e;
    throw new Error(`${err.message.split(/\.\s/)[0]} (flags: ${usage(flags)})`);
  }
  const values: Record<string, unknown> = {};
  const consumed = new Set<number>();
  for (const t of tokens) {
    if (t.kind !== 'option' || !Object.hasOwn(flags, t.name)) continue;
    const flag = flags[t.name]!;
    consumed.add(t.index);
    if (!flag.takesValue) {
      values[t.name] = true;
      continue;
    }
    // Without strict (passThrough), parseArgs leaves a value-taking flag at the end without its value.
    if (t.value === undefined) throw new Error(`--${t.name} needs a value (flags: ${usage(flags)})`);
    if (!t.inlineValue) consumed.add(t.index + 1);
    values[t.name] = flag.parse(t.value, `--${t.name}`);
  }
  return { values: values as FlagValues<S>, rest: args.filter((_, i) => !consumed.has(i)) };
}

/** --quick (smoke size: proves the benchmark runs, its figures mean nothing) and --rounds N. */
export const ROUND_FLAGS = { quick: bool, rounds: int(1) };

/** The harness's common flags, the rest passed through for the bench to read (its positional sizes, its own flags). */
export function commonFlags(args: string[], defaultRounds = 3): { quick: boolean; rounds: number; rest: string[] } {
  const { values, rest } = parseFlags(args, ROUND_FLAGS, { passThrough: true });
  return { quick: values.quick === true, rounds: values.rounds ?? defaultRounds, rest };
}

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
