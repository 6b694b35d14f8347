// Parsers for command-line option values, shared by the subcommands: a bad value fails before any work starts,
// with a message naming the option.
import { RlstreamError } from '../core/errors.ts';

export interface NumberRule {
  integer?: boolean;
  min?: number;
}

/** A commander option parser for a finite number (optionally an integer ≥ min). */
export function numberOption(name: string, rule: NumberRule = {}): (value: string) => number {
  return (v: string) => {
    const x = Number(v);
    const kind = rule.integer ? 'an integer' : 'a number';
    if (v.trim() === '' || !Number.isFinite(x) || (rule.integer && !Number.isInteger(x))) throw new RlstreamError('CONFIG_INVALID', `${name} must be ${kind}, got "${v}"`);
    if (rule.min !== undefined && x < rule.min) throw new RlstreamError('CONFIG_INVALID', `${name} must be at least ${rule.min}, got ${x}`);
    return x;
  };
}
