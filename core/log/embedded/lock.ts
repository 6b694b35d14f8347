// Exclusive ownership of a log directory: one process (and one open log within it) at a time. The LOCK file
// holds the owner's pid; it is created by link(2) from a complete temporary file, so nobody ever reads a
// half-written pid. A lock whose process is gone (a crash, SIGKILL) is stale and is taken over.
import { linkSync, readFileSync, realpathSync, renameSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../../errors.ts';

const heldHere = new Set<string>();

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function holder(path: string): number | null {
  try {
    const pid = Number.parseInt(readFileSync(path, 'utf8'), 10);
    return Number.isFinite(pid) ? pid : null;
  } catch {
    return null;
  }
}

export class DirectoryLock {
  private constructor(
    private readonly key: string,
    private readonly path: string,
  ) {}

  static acquire(dir: string): DirectoryLock {
    const key = realpathSync(dir);
    const path = join(dir, 'LOCK');
    if (heldHere.has(key)) throw new RlstreamError('LOG_LOCKED', `log directory ${dir} is already open in this process (pid ${process.pid})`);
    const tmp = join(dir, `LOCK.${process.pid}.tmp`);
    writeFileSync(tmp, `${process.pid}\n`);
    try {
      for (let attempt = 0; attempt < 5; attempt++) {
        try {
          linkSync(tmp, path);
          heldHere.add(key);
          return new DirectoryLock(key, path);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        }
        const pid = holder(path);
        if (pid !== null && pid !== process.pid && alive(pid)) {
          throw new RlstreamError('LOG_LOCKED', `log directory ${dir} is locked by process ${pid}`);
        }
        // Stale: move it aside atomically (only one contender wins the rename), then retry the link.
        try {
          renameSync(path, `${path}.stale.${process.pid}`);
          unlinkSync(`${path}.stale.${process.pid}`);
        } catch {
          /* another process took it over first; the next link attempt decides */
        }
      }
      throw new RlstreamError('LOG_LOCKED', `log directory ${dir}: could not take over a stale lock`);
    } finally {
      unlinkSync(tmp);
    }
  }

  release(): void {
    if (!heldHere.delete(this.key)) return;
    if (holder(this.path) === process.pid) unlinkSync(this.path);
  }
}
