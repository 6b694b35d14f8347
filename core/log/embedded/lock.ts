// Exclusive ownership of a log directory: one process (and one open log within it) at a time. The LOCK file
// holds the owner's pid; it is created by link(2) from a complete temporary file, so nobody ever reads a
// half-written pid, and the owner keeps that file open for as long as it holds the lock: on Linux, whether the
// pid in a LOCK still holds this log is then a fact (/proc/<pid>/fd), not a guess from the pid being alive.
// A lock whose process is gone (a crash, SIGKILL) is stale and is taken over. One whose pid is alive but holds
// no file of the log (the pid reused by an unrelated process after a crash) is stale too, but a plain open only
// reports it with the fix: taking it over is left to `rlstream log repair` (breakStale), since a process this
// one cannot inspect (another user's) is never judged stale.
// The temporary file is named by pid and a random suffix and lives under its own prefix (LOCK.<pid>.<rand>.pending),
// which nothing else in the directory cleans up: two processes starting together each have their own, and the
// one that wins the lock never deletes the other's.
import { randomBytes } from 'node:crypto';
import { closeSync, linkSync, lstatSync, openSync, readdirSync, readFileSync, readlinkSync, realpathSync, renameSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { RlstreamError } from '../../errors.ts';
import { fileKind, repairCommand, unlinkIfThere } from './damage.ts';

const heldHere = new Set<string>();

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  // A zombie (ended, not yet reaped by its parent) answers signal 0 but holds nothing any more.
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '')[0] !== 'Z';
  } catch {
    return true;
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

/** The command line of a process, for messages ('' when it cannot be read). */
function commandOf(pid: number): string {
  try {
    const line = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ').replace(/\s+/g, ' ');
    return line.length > 120 ? `${line.slice(0, 117)}...` : line;
  } catch {
    return '';
  }
}

/**
 * Whether a live process holds a file inside the log directory open (the lock holder keeps its lock file open;
 * a writer keeps its journal and segments open): null when that cannot be told (no /proc, another user's process).
 */
function holdsLog(pid: number, dir: string): boolean | null {
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return null;
  }
  const prefix = `${realpathSync(dir)}/`;
  for (const fd of fds) {
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith(prefix)) return true;
    } catch {
      /* closed meanwhile */
    }
  }
  return false;
}

/** Who holds a log directory's LOCK, as far as can be told (`rlstream log check` reports it). */
export interface LockState {
  file: string;
  pid: number | null;
  /**
   * 'held': a live process with the log open; 'gone': its process ended (the next open takes the lock over);
   * 'stale': a live process that holds nothing of the log, or not a lock file at all (only a repair clears it).
   */
  state: 'held' | 'gone' | 'stale' | 'unknown';
  /** The process's command line, when alive and readable. */
  command: string;
  why: string;
  /** The LOCK was released or replaced while it was inspected: look again. */
  changed?: boolean;
}

function inode(path: string): number | null {
  try {
    return lstatSync(path).ino;
  } catch {
    return null;
  }
}

export function inspectLock(dir: string): LockState | null {
  const file = join(dir, 'LOCK');
  const kind = fileKind(file);
  if (kind === 'missing') return null;
  if (kind !== 'file') return { file, pid: null, state: 'stale', command: '', why: `${file} is not a file` };
  const pid = holder(file);
  if (pid === null) return { file, pid, state: 'unknown', command: '', why: 'it holds no pid' };
  if (pid === process.pid) return { file, pid, state: 'held', command: commandOf(pid), why: 'this process holds it' };
  if (!alive(pid)) return { file, pid, state: 'gone', command: '', why: `process ${pid} is gone (the next open takes the lock over)` };
  const ino = inode(file);
  const holds = holdsLog(pid, dir);
  const command = commandOf(pid);
  // A holder that released the lock while its files were looked at holds nothing any more: no verdict on a LOCK
  // that changed meanwhile (another process may hold it now).
  if (holds === false && (inode(file) !== ino || holder(file) !== pid)) return { file, pid, state: 'unknown', command, why: `the lock changed hands while process ${pid} was inspected`, changed: true };
  const named = `process ${pid}${command ? ` (${command})` : ''}`;
  if (holds === null) return { file, pid, state: 'unknown', command, why: `${named} is running and cannot be inspected (another user's?)` };
  if (holds) return { file, pid, state: 'held', command, why: `${named} has the log open` };
  return { file, pid, state: 'stale', command, why: `${named} is running but has no file of this log open: not an rlstream process holding it (its pid was reused after the holder ended)` };
}

export interface LockOptions {
  /** Take over a lock whose pid is alive but holds nothing of the log (`rlstream log repair`). */
  breakStale?: boolean;
}

export class DirectoryLock {
  /** The stale lock of a live, unrelated pid this acquire took over (breakStale), for the repair's report. */
  tookOver: LockState | null = null;

  private constructor(
    private readonly key: string,
    private readonly path: string,
    /** The lock file kept open (see above). */
    private fd: number,
  ) {}

  static acquire(dir: string, options: LockOptions = {}): DirectoryLock {
    const key = realpathSync(dir);
    const path = join(dir, 'LOCK');
    if (heldHere.has(key)) throw new RlstreamError('LOG_LOCKED', `log directory ${dir} is already open in this process (pid ${process.pid})`);
    const kind = fileKind(path);
    if (kind !== 'file' && kind !== 'missing' && options.breakStale) renameSync(path, `${path}.quarantine`);
    else if (kind !== 'file' && kind !== 'missing') {
      throw new RlstreamError('LOG_LOCKED', `log directory ${dir}: ${path} is ${kind === 'directory' ? 'a directory' : 'not a file'}, where the lock file belongs: run \`${repairCommand(dir)}\` to move it aside`);
    }
    const tmp = join(dir, `LOCK.${process.pid}.${randomBytes(4).toString('hex')}.pending`);
    let fd = -1;
    let tookOver: LockState | null = null;
    try {
      for (let attempt = 0, changed = 0; attempt < 5; attempt++) {
        // Written again on each attempt: cheap, and a temporary file removed by anyone (an operator's
        // cleanup) then costs one more attempt instead of an ENOENT crash.
        if (fd >= 0) closeSync(fd);
        fd = openSync(tmp, 'w');
        writeSync(fd, `${process.pid}\n`);
        try {
          linkSync(tmp, path);
          heldHere.add(key);
          const lock = new DirectoryLock(key, path, fd);
          lock.tookOver = tookOver;
          fd = -1;
          return lock;
        } catch (err) {
          const code = (err as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') continue;
          if (code !== 'EEXIST') throw err;
        }
        const pid = holder(path);
        if (pid !== null && pid !== process.pid && alive(pid)) {
          const state = inspectLock(dir);
          if ((state === null || state.changed) && changed++ < 100) {
            // Released (or passed on) while it was looked at: try again, without counting it as a failed attempt.
            attempt--;
            continue;
          }
          if (state === null) throw new RlstreamError('LOG_LOCKED', `log directory ${dir} is locked by process ${pid}`);
          if (state.state !== 'stale' || !options.breakStale) {
            const fix =
              state.state === 'stale'
                ? `: the lock is stale. Run \`${repairCommand(dir)}\` to take it over (it checks the log too), or delete ${path} once you are sure no rlstream process uses the log`
                : '';
            throw new RlstreamError('LOG_LOCKED', `log directory ${dir} is locked by process ${state.pid ?? pid}: ${state.why}${fix}`);
          }
          tookOver = state;
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
      if (fd >= 0) closeSync(fd);
      unlinkIfThere(tmp);
    }
  }

  release(): void {
    if (!heldHere.delete(this.key)) return;
    if (holder(this.path) === process.pid) unlinkIfThere(this.path);
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}

