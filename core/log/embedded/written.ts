// written.json: each partition's high-water mark as a writer noted it after each append, with the id of the
// machine's boot. The manifest lists only what was on disk when it was written, so after a writer is killed its
// last records are not listed there, and a cut among them would pass for a torn tail. Records a process wrote to
// its files are in the page cache, which only a machine crash loses: on the same boot, every record below these
// marks must be there, and a cut below them is damage. After a reboot, or when the file is missing, unreadable or
// fails its CRC, it says nothing and the manifest alone decides.
// The note follows the segment's write() (never ahead of what the files hold) and is one write() in place into a
// file the writer keeps open, padded to its longest content (no fsync: a machine crash makes it void anyway; no
// rename: a note per append must cost little). A write cut short by a kill fails the CRC and says nothing.
// Each append is noted twice: before its segment write, with the high-water mark it is about to reach (`writing`),
// and after it. A SIGKILL between the two leaves the files holding at most `writing` and at least the mark: files
// ending between them are an append cut by the kill, not damage; but where the partition's segment files are gone
// altogether, the loss runs to `writing` (that last append may or may not have reached the file, and is listed as
// such), so no record a writer appended goes unlisted when its segment is deleted.
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { unlinkIfThere } from './damage.ts';

const FILE = 'written.json';

let boot: string | null | undefined;

/** This boot of the machine (Linux); null where it cannot be told, and then written.json is never used. */
export function bootId(): string | null {
  if (boot === undefined) boot = readBootId();
  return boot;
}

function readBootId(): string | null {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim() || null;
  } catch {
    return null;
  }
}

function key(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}

/** A partition's marks: `high` reached the files; `writing` (≥ high) was being appended when the note was made. */
export interface WrittenMark {
  high: number;
  writing: number;
}

/** The marks noted on this boot, by topic and partition; empty when there are none to trust. */
export function readWritten(logDir: string): (topic: string, partition: number) => WrittenMark | undefined {
  const thisBoot = bootId();
  const marks = new Map<string, WrittenMark>();
  try {
    const parsed = JSON.parse(readFileSync(join(logDir, FILE), 'utf8')) as { bootId?: unknown; crc?: unknown; highs?: unknown };
    if (thisBoot !== null && parsed.bootId === thisBoot && Array.isArray(parsed.highs) && parsed.crc === crc32(JSON.stringify(parsed.highs))) {
      for (const h of parsed.highs as unknown[]) {
        if (Array.isArray(h) && typeof h[0] === 'string' && Number.isSafeInteger(h[1]) && Number.isSafeInteger(h[2])) {
          const high = h[2] as number;
          // (a note without the fourth field: no append under way)
          const writing = Number.isSafeInteger(h[3]) && (h[3] as number) > high ? (h[3] as number) : high;
          marks.set(key(h[0], h[1] as number), { high, writing });
        }
      }
    }
  } catch {
    /* none, or unreadable: no evidence */
  }
  return (topic, partition) => marks.get(key(topic, partition));
}

/** A writer's written.json, open from its first note to its close. */
export class WrittenNotes {
  private fd: number | null = null;
  private length = 0;

  constructor(private readonly logDir: string) {}

  /** Each partition's mark, and where an append is under way the mark it is about to reach. */
  note(highs: [topic: string, partition: number, high: number, writing?: number][]): void {
    const thisBoot = bootId();
    if (thisBoot === null) return;
    // The previous writer's marks were read by this open (readWritten) before its first append: 'w' drops them.
    if (this.fd === null) this.fd = openSync(join(this.logDir, FILE), 'w');
    const h = JSON.stringify(highs);
    const buf = Buffer.from(`{"bootId":${JSON.stringify(thisBoot)},"crc":${crc32(h)},"highs":${h}}`.padEnd(this.length, ' '));
    writeSync(this.fd, buf, 0, buf.length, 0);
    this.length = buf.length;
  }

  /** A clean close lists every record in the manifest: the marks are no longer needed. */
  forget(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
    unlinkIfThere(join(this.logDir, FILE));
  }
}
