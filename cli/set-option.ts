// The repeatable `--set key.path=value` option of the commands that read a run configuration: each value is
// YAML (a number, a boolean, a list), collected into the overrides loadRunConfig applies.
import { parse } from 'yaml';

export function collectSet(value: string, previous: Record<string, unknown>): Record<string, unknown> {
  const eq = value.indexOf('=');
  if (eq <= 0) throw new Error(`--set expects key.path=value, got ${JSON.stringify(value)}`);
  return { ...previous, [value.slice(0, eq)]: parse(value.slice(eq + 1)) as unknown };
}

/** `--nproc N`: the same override as `--set trainer.devices=N` (validated there, so a bad N is named at that path). */
export function nprocOption(nproc: string | undefined, overrides: Record<string, unknown>): Record<string, unknown> {
  return nproc === undefined ? overrides : collectSet(`trainer.devices=${nproc}`, overrides);
}
