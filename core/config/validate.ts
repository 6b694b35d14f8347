// Checks one value of a run config against its TypeBox schema (ajv, every error at once), fills in the
// defaults, and words each error as `path: what is wrong (the fix)`: an unknown key names the closest known
// key, an enum the allowed values, a number its range. Config compilers collect these issues across every
// section so `rlstream config check` lists all of them, and start-up fails before any role runs.
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { RlstreamError } from '../errors.ts';
import { didYouMean } from './suggest.ts';

export interface ConfigIssue {
  /** Dotted path of the field (`reward.shaping.tool_success_bonus`, `sft.stages[1].steps`). */
  path: string;
  message: string;
}

/** A config that does not compile: every issue, one per line. */
export class ConfigError extends RlstreamError {
  constructor(readonly issues: readonly ConfigIssue[]) {
    super('CONFIG_INVALID', issues.map((i) => `${i.path}: ${i.message}`).join('\n'));
  }
}

/** Keys that were renamed or moved: the fix for a config written against the old name. */
const MOVED: Record<string, string> = {
  policy: 'the built-in policy is configured under backend: (name: builtin, with max_batch, threads, workers)',
  'backend.swap_mode': 'how a policy update reaches rollouts under way is rollout.interrupt (next_turn | finish | next_token)',
  'rollout.staleness_bound': 'the staleness bound is set once, as trainer.staleness_bound',
  'rollout.groups_per_step': 'groups per step is set once, as trainer.groups_per_step',
  'trainer.clip_low': "each policy loss has its own section: trainer.ppo.clip_low (or that of trainer.policy_loss's loss)",
  'trainer.clip_high': "each policy loss has its own section: trainer.ppo.clip_high (or that of trainer.policy_loss's loss)",
  'trainer.dual_clip_c': 'the dual clip is a ppo option: trainer.ppo.dual_clip_c',
  'trainer.iw_cap': 'the truncated importance weight is trainer.rollout_correction (mode: truncate, cap: C; mode: off for plain PPO)',
};

// verbose: errors carry their schema, so an unknown key can be matched against the known ones.
const ajv = new Ajv({ allErrors: true, useDefaults: true, strict: false, coerceTypes: false, verbose: true });
const compiled = new WeakMap<TSchema, ValidateFunction>();

function validator<S extends TSchema>(schema: S): ValidateFunction<Static<S>> {
  let v = compiled.get(schema);
  if (!v) {
    v = ajv.compile(schema);
    compiled.set(schema, v);
  }
  return v as ValidateFunction<Static<S>>;
}

function join(base: string, instancePath: string): string {
  let p = base;
  for (const seg of instancePath.split('/').slice(1)) {
    const s = seg.replace(/~1/g, '/').replace(/~0/g, '~');
    p = /^\d+$/.test(s) ? `${p}[${s}]` : p === '' ? s : `${p}.${s}`;
  }
  return p === '' ? '(config)' : p;
}

function shown(v: unknown): string {
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

function valueAt(data: unknown, instancePath: string): unknown {
  let cur = data;
  for (const seg of instancePath.split('/').slice(1)) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, unknown>)[seg.replace(/~1/g, '/').replace(/~0/g, '~')];
  }
  return cur;
}

function typeWord(t: unknown): string {
  const words: Record<string, string> = { integer: 'an integer', number: 'a number', string: 'a string', boolean: 'true or false', object: 'a mapping', array: 'a list', null: 'null' };
  const list = Array.isArray(t) ? t : [t];
  return list.map((x) => words[String(x)] ?? String(x)).join(' or ');
}

function issueOf(e: ErrorObject, base: string, data: unknown): ConfigIssue | null {
  const path = join(base, e.instancePath);
  const got = valueAt(data, e.instancePath);
  const p = e.params as Record<string, unknown>;
  const range = (op: string) => ({ path, message: `must be ${op} ${String(p['limit'])} (got ${shown(got)})` });
  switch (e.keyword) {
    case 'additionalProperties': {
      const key = String(p['additionalProperty']);
      const full = path === '(config)' ? key : `${path}.${key}`;
      const known = Object.keys((e.parentSchema as { properties?: Record<string, unknown> } | undefined)?.properties ?? {});
      const moved = MOVED[full];
      return { path: full, message: moved ? `unknown key: ${moved}` : `unknown key${didYouMean(key, known)} (known: ${known.join(', ') || 'none'})` };
    }
    case 'required': {
      const key = String(p['missingProperty']);
      return { path: path === '(config)' ? key : `${path}.${key}`, message: 'is required' };
    }
    case 'type':
      return { path, message: `must be ${typeWord(p['type'])} (got ${shown(got)})` };
    case 'enum': {
      const allowed = (p['allowedValues'] as unknown[]).map(String);
      return { path, message: `must be one of ${allowed.join(', ')} (got ${shown(got)})${typeof got === 'string' ? didYouMean(got, allowed) : ''}` };
    }
    case 'minimum':
      return range('>=');
    case 'maximum':
      return range('<=');
    case 'exclusiveMinimum':
      return range('>');
    case 'exclusiveMaximum':
      return range('<');
    case 'minLength':
      return { path, message: Number(p['limit']) === 1 ? 'must not be empty' : `must have at least ${String(p['limit'])} characters` };
    case 'minItems':
      return { path, message: `must list at least ${String(p['limit'])} item(s)` };
    case 'pattern':
      return { path, message: `must match ${String(p['pattern'])} (got ${shown(got)})` };
    case 'if':
      return null;
    case 'const':
      // A branch of a union of literals (TypeBox Type.Union of Type.Literal): reported once, by its anyOf.
      if (e.schemaPath.includes('/anyOf/')) return null;
      return { path, message: `must be ${shown(p['allowedValue'])} (got ${shown(got)})` };
    case 'anyOf': {
      const branches = ((e.parentSchema as { anyOf?: { const?: unknown }[] } | undefined)?.anyOf ?? []);
      if (branches.length > 0 && branches.every((b) => b.const !== undefined)) {
        const allowed = branches.map((b) => String(b.const));
        return { path, message: `must be one of ${allowed.join(', ')} (got ${shown(got)})${typeof got === 'string' ? didYouMean(got, allowed) : ''}` };
      }
      return { path, message: `does not match any allowed form (got ${shown(got)})` };
    }
    default:
      return { path, message: e.message ?? e.keyword };
  }
}

/**
 * Validate `raw` against `schema` at `base` (a dotted path), with defaults filled in. Returns the value, or
 * null after pushing every issue onto `issues`. `undefined` and `null` stand for an empty section.
 */
export function check<S extends TSchema>(schema: S, raw: unknown, base: string, issues: ConfigIssue[]): Static<S> | null {
  const data = raw === undefined || (raw === null && schema.type === 'object') ? {} : structuredClone(raw);
  const v = validator(schema);
  if (v(data)) return data;
  const seen = new Set<string>();
  for (const e of v.errors ?? []) {
    const issue = issueOf(e, base, data);
    if (!issue) continue;
    const key = `${issue.path}\u0000${issue.message}`;
    if (!seen.has(key)) issues.push(issue);
    seen.add(key);
  }
  return null;
}

/** Like check(), for one value that must compile on its own: throws ConfigError listing every issue. */
export function compileValue<S extends TSchema>(schema: S, raw: unknown, base: string): Static<S> {
  const issues: ConfigIssue[] = [];
  const out = check(schema, raw, base, issues);
  if (out === null) throw new ConfigError(issues);
  return out;
}

// ---- schema helpers: plain JSON Schema shapes that ajv reports as one error each -------------------------

/** One of a fixed set of strings (one `enum` error naming them, rather than one error per alternative). */
export function oneOf<const T extends readonly string[]>(values: T, options: { default?: T[number]; description: string }) {
  return Type.Unsafe<T[number]>({ type: 'string', enum: [...values], ...options });
}

/** An integer or null (null turns the feature off). */
export function intOrNull(options: { minimum?: number; default: number | null; description: string }) {
  return Type.Unsafe<number | null>({ type: ['integer', 'null'], ...options });
}

/** A number or null. */
export function numberOrNull(options: { minimum?: number; exclusiveMinimum?: number; maximum?: number; default: number | null; description: string }) {
  return Type.Unsafe<number | null>({ type: ['number', 'null'], ...options });
}

/** A string or null (unset). */
export function stringOrNull(options: { default: string | null; description: string; minLength?: number }) {
  return Type.Unsafe<string | null>({ type: ['string', 'null'], ...options });
}
