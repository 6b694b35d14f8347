// A read-only view of a live chDB store for the SQL sandbox: the store's directory tree rebuilt under the
// sandbox's scratch directory, its files hard-linked (no data copied; ClickHouse never rewrites a part's files
// in place, it writes new parts and renames them in whole). Directories are made for and owned by the sandbox's
// user, so its engine can keep its own state there, while the linked files stay the store's owner's with their
// mode: the sandbox can read a part, not change it. A file the sandbox's user could not read (a store written
// under a strict umask) is copied instead and given to that user.
import { chownSync, copyFileSync, linkSync, lstatSync, mkdirSync, readdirSync, readlinkSync, rmSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';

/** Entries that are the live engine's own (its lock file) or not finished (parts being written or removed). */
const SKIP = /^(status|tmp_.*|delete_tmp_.*|tmp-fetch_.*)$/;

export interface Owner {
  uid: number;
  gid: number;
}

/** Hard-links s at d; false across file systems (the caller copies instead). */
function link(s: string, d: string): boolean {
  try {
    linkSync(s, d);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EXDEV') return false;
    throw err;
  }
}

function copyTree(src: string, dst: string, owner: Owner | null): number {
  mkdirSync(dst);
  if (owner) chownSync(dst, owner.uid, owner.gid);
  let files = 0;
  for (const e of readdirSync(src, { withFileTypes: true })) {
    if (SKIP.test(e.name)) continue;
    const s = join(src, e.name);
    const d = join(dst, e.name);
    try {
      if (e.isSymbolicLink()) symlinkSync(readlinkSync(s), d);
      else if (e.isDirectory()) files += copyTree(s, d, owner);
      else if (e.isFile()) {
        const worldReadable = (lstatSync(s).mode & 0o004) !== 0;
        if (!((!owner || worldReadable) && link(s, d))) {
          copyFileSync(s, d);
          if (owner) chownSync(d, owner.uid, owner.gid);
        }
        files++;
      }
    } catch (err) {
      // A part the engine merged away while we walked: its absence is what the next snapshot would show too.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
  return files;
}

/** Rebuilds `src` at `dst` (replacing it) for the sandbox's user; returns the number of files linked or copied. */
export function snapshotStore(src: string, dst: string, owner: Owner | null): number {
  rmSync(dst, { recursive: true, force: true });
  return copyTree(src, dst, owner);
}
