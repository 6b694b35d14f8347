// Where a command writes a file: never over an input, and over an existing file only when told (the flag that
// allows it is named in the refusal). Checked before any work starts, so a refused command has read nothing.
import { existsSync, realpathSync, statSync } from 'node:fs';
import { dirname, isAbsolute, join, relative, resolve, sep } from 'node:path';
import { RlstreamError } from '../core/errors.ts';

/** Whether two paths name the same file: the same inode when both exist (links included), else the same absolute path. */
export function samePath(a: string, b: string): boolean {
  if (existsSync(a) && existsSync(b)) {
    const x = statSync(a);
    const y = statSync(b);
    return x.dev === y.dev && x.ino === y.ino;
  }
  return resolve(a) === resolve(b);
}

export interface OutputCheck {
  /** The option that names the output (`--output`, `--into jsonl:`). */
  option: string;
  /** The flag that allows replacing an existing output (`--force`), and whether it was given. */
  forceFlag: string;
  force: boolean;
  /** Inputs of the command, by the option that names them: the output may never be one of them. */
  inputs?: Record<string, string>;
}

/** Refuse an output that is one of the inputs (always) or that exists (unless forced); a directory is never replaced. */
export function checkOutputPath(output: string, c: OutputCheck): void {
  for (const [option, input] of Object.entries(c.inputs ?? {})) {
    if (samePath(output, input)) throw new RlstreamError('INPUT_INVALID', `${c.option} ${output} is the same file as ${option} ${input}: writing it would destroy the input; choose another output`);
  }
  if (!existsSync(output)) return;
  if (statSync(output).isDirectory()) throw new RlstreamError('INPUT_INVALID', `${c.option} ${output} is a directory; name a file`);
  if (!c.force) throw new RlstreamError('INPUT_INVALID', `${c.option} ${output} exists; ${c.forceFlag} replaces it`);
}

/** The absolute path with links resolved as far as it exists (a file still to be written: its folder's links). */
function realish(p: string): string {
  const abs = resolve(p);
  let head = abs;
  while (!existsSync(head) && dirname(head) !== head) head = dirname(head);
  return existsSync(head) ? join(realpathSync(head), relative(head, abs)) : abs;
}

/** Whether `path` lies inside the directory `dir` (or is it), links resolved: a link into the directory counts. */
export function insideDir(path: string, dir: string): boolean {
  const r = relative(realish(dir), realish(path));
  return r === '' || (r !== '..' && !r.startsWith(`..${sep}`) && !isAbsolute(r));
}
