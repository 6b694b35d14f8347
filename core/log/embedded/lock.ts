// Exclusive ownership of a log directory: one process (and one open log within it) at a time. The LOCK file
// holds the owner's pid; it is created by link(2) from a complete temporary file, so nobody ever reads a
// half-written pid. A lock whose process is gone (a crash, SIGKILL) is stale and is taken over.
// The temporary file is named by pid and a random suffix and lives under its own prefix (LOCK.<pid>.<rand>.pending),
// which nothing else in the directory cleans up: two processes starting together each have their own, and the
// one that wins the lock never deletes the other's.
import { randomBytes } from 'node:crypto';
import { linkSync, readFileSync, realpathSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../../errors.ts';
import { unlinkIfThere } from './damage.ts';

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
    const tmp = join(dir, `LOCK.${process.pid}.${randomBytes(4).toString('hex')}.pending`);
    try {
      for (let attempt = 0; attempt < 5; attempt++) {
        // Written again on each attempt: cheap, and a temporary file removed by anyone (an operator's
        // cleanup) then costs one more attempt instead of an ENOENT crash.
        writeFileSync(tmp, `${process.pid}\n`);
        try {
          linkSync(tmp, path);
          heldHere.add(key);
          return new DirectoryLock(key, path);
        } catch (err) {
          const code = (err as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') continue;
          if (code !== 'EEXIST') throw err;
        }
        const pid = holder(path);
        if (pid !== null && pid !== process.pid && alive(pid)) {
          throw new RlstreamError('LOG_LOCKED', `log directory ${dir} is locked by process ${pid}`);
        }
        if (pid === null) {
          // Gone between the link and the read (a contender moving a stale lock aside) or holding no pid:
          // wait a moment and try the link again; never delete a lock whose owner is unknown.
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
          continue;
        }
        // Stale: move it aside atomically (only one contender wins the rename), then retry the link.
        const aside = `${path}.stale.${process.pid}`;
        try {
          renameSync(path, aside);
          unlinkIfThere(aside);
        } catch {
          /* another process took it over first; the next link attempt decides */
        }
      }
      throw new RlstreamError('LOG_LOCKED', `log directory ${dir}: could not take its LOCK (held by no live process, or holding no pid: delete ${path} if no process uses the log)`);
    } finally {
      unlinkIfThere(tmp);
    }
  }

  release(): void {
    if (!heldHere.delete(this.key)) return;
    if (holder(this.path) === process.pid) unlinkIfThere(this.path);
  }
}
