// A benchmark mode that runs in its own process: the bench file re-runs itself with `--child <spec JSON>`, so no
// JIT, native or event-loop state of one mode reaches the next, and the child hands back one marked JSON line.
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = resolve(fileURLToPath(new URL('..', import.meta.url)));

/**
 * Run `script` (a bench file's import.meta.url) as a child on `spec`; its stderr goes to `<spec.dataDir>/bench-child.log`.
 * Resolves the JSON after `marker` on its stdout; a child that fails, is killed at `timeoutS` or prints no result
 * rejects with `name` and the end of its stderr.
 */
export async function runBenchChild<T>(script: string, name: string, spec: { dataDir: string }, marker: string, timeoutS: number): Promise<T> {
  const log = join(spec.dataDir, 'bench-child.log');
  const child = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(script), '--child', JSON.stringify(spec)], { cwd: REPO, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    child.kill('SIGKILL');
  }, timeoutS * 1000);
  const code = await new Promise<number | null>((res) => child.on('close', res));
  clearTimeout(timer);
  writeFileSync(log, err);
  const line = out.split('\n').find((l) => l.startsWith(marker));
  if (code !== 0 || !line) throw new Error(`${name}: the main job ${timedOut ? `did not finish within ${timeoutS} s (killed)` : `exited with ${code}`}; its stderr (${log}) ends:\n${err.slice(-2000)}`);
  return JSON.parse(line.slice(marker.length)) as T;
}

/** In the child: print the result line, then exit once it is out (nothing of the finished run should keep it alive). */
export function writeBenchChildResult(marker: string, result: unknown): void {
  process.stdout.write(`${marker}${JSON.stringify(result)}\n`, () => process.exit(0));
}

/** The spec when this process is `script`'s child, else null. */
export function benchChildSpec<S>(script: string): S | null {
  if (!process.argv[1] || resolve(process.argv[1]) !== fileURLToPath(script) || process.argv[2] !== '--child') return null;
  return JSON.parse(process.argv[3] ?? '{}') as S;
}
