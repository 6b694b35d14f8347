// One life of `rlstream run` as a real process, optionally SIGKILLed inside the run: the crash tests
// (test/e2e/resume.test.ts, test/e2e/exactly-once-damage.test.ts) drive a run through several such lives.
import { spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const ROOT = resolve(import.meta.dirname, '..');

export interface Life {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/**
 * When a life is killed: `delayMs` after it printed `afterSteps` train steps of its own. Drawn from the life's own
 * progress rather than the clock, so a kill lands inside the run whether the machine is fast or slow.
 */
export interface Kill {
  afterSteps: number;
  delayMs: number;
}

/** The train steps a life printed on stderr (`train N/…` progress lines), in order. */
export const stepsPrinted = (stderr: string): number[] => [...stderr.matchAll(/^train\s+(\d+)\//gm)].map((m) => Number(m[1]));

/** `rlstream run <config> --no-admin --no-progress --set k=v…` to its end, or SIGKILLed at `kill`. */
export async function runLife(config: string, sets: Record<string, string | number>, kill: Kill | null): Promise<Life> {
  const args = Object.entries(sets).flatMap(([k, v]) => ['--set', `${k}=${v}`]);
  const child = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'cli/main.ts'), 'run', config, '--no-admin', '--no-progress', ...args], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  const out: Life = { code: null, signal: null, stdout: '', stderr: '' };
  child.stdout.on('data', (d: Buffer) => (out.stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out.stderr += d.toString()));
  const exited = new Promise<void>((res) => child.once('exit', (code, signal) => ((out.code = code), (out.signal = signal), res())));
  if (kill !== null) {
    while (!/^run: /m.test(out.stderr) && child.exitCode === null) await sleep(20);
    while (stepsPrinted(out.stderr).length < kill.afterSteps && child.exitCode === null) await sleep(20);
    await Promise.race([sleep(kill.delayMs), exited]);
    child.kill('SIGKILL');
  }
  await exited;
  return out;
}
