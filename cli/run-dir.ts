// A run directory as the commands that read a finished run take it: the main job writes each run under
// <data_dir>/<run id>, with its embedded log in log/ and its chDB traces in chdb/. A user hands the run
// directory as often as its log/; opening the run directory as a log would create an empty log inside it.
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../core/errors.ts';

/**
 * What `--log` names on the embedded default: a log directory, or a run directory (the main job's
 * `<data_dir>/<run id>`, holding `log/` and `chdb/`), whose traces are then served too unless --traces says
 * otherwise. A directory that is neither is refused: opening it would create an empty log there.
 */
export function resolveEmbeddedLog(dir: string, traces: string | undefined, flag = '--log'): { log: string; traces: string | undefined } {
  if (!existsSync(dir)) throw new RlstreamError('CONFIG_INVALID', `${flag} ${dir} does not exist: give a run directory (<data_dir>/<run id>) or its log/ directory`);
  if (!statSync(dir).isDirectory()) throw new RlstreamError('CONFIG_INVALID', `${flag} ${dir} is not a directory`);
  const isLog = (d: string) => existsSync(join(d, 'topics')) || readdirSync(d).some((f) => /^journal-\d+\.log$/.test(f));
  if (isLog(dir)) return { log: dir, traces };
  if (existsSync(join(dir, 'log')) && isLog(join(dir, 'log'))) {
    const chdb = join(dir, 'chdb');
    return { log: join(dir, 'log'), traces: traces ?? (existsSync(chdb) ? chdb : undefined) };
  }
  throw new RlstreamError('CONFIG_INVALID', `${flag} ${dir} is neither an embedded log nor a run directory (one holding log/ and chdb/): give the run directory (<data_dir>/<run id>) or its log/ directory`);
}

