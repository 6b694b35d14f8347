// What the trainer has consumed, by trajectory id: the trajectories its committed steps took (trained, or dropped
// as stale). A record of one of them that comes again — re-delivered after a damaged log was repaired, re-read
// from a rewound offset, published twice by a producer — is skipped and counted instead of trained twice.
//
// It is part of the trainer's durable state: each step's checkpoint holds its exact tier (consumed.json, written
// before the step's transaction commits), and a restart merges that with the ids the log's TrainSteps list, so
// either one surviving damage is enough for the exact tier; the older tier is rebuilt from the TrainSteps.
//
// Two tiers, each bounded. The exact tier holds the ids a re-read record could still be trained under: a sample
// generated at policy version v trains only while v >= version - bound, and a record read again carries the same
// v, so below that horizon it is dropped as stale anyway; the tier holds about (bound + 1) steps' trajectories and
// is what the checkpoint saves. The horizon only rises: after set_staleness raises the bound, a sample below it
// is still dropped as stale, since whether it was trained before can no longer be told.
// The older tier catches a trajectory generated again under an id already trained (a producer that re-runs a
// trajectory without a new id, as the rollout worker did before reruns got new ids): that copy carries a new
// version and passes the horizon. It keeps a 48-bit fingerprint of each id that left the exact tier, the newest
// OLDER_CAPACITY of them (tens of MB at most; a false match is about 1 in 2^48 / OLDER_CAPACITY per record), and
// is rebuilt on restart from the log's TrainSteps, which list every id a committed step took.
import { createHash } from 'node:crypto';
import { open, readFile, rename } from 'node:fs/promises';
import { join } from 'node:path';

const FILE = 'consumed.json';
const OLDER_CAPACITY = 1_000_000;

function fingerprint(id: string): number {
  return createHash('sha256').update(id).digest().readUIntBE(0, 6);
}

interface Saved {
  horizon: number;
  /** [trajectory id, policy version it was generated at (an upper bound of it for ids read from TrainSteps)]. */
  ids: [string, number][];
}

export class ConsumedTrajectories {
  /** Fingerprints of ids below the horizon, oldest first (a Set iterates in insertion order). */
  private readonly older = new Set<number>();

  private constructor(
    private horizonVersion: number,
    private readonly ids: Map<string, number>,
  ) {}

  /** No horizon until a step sets one: a run's first samples may come from versions below 0 (tests, imports). */
  static empty(): ConsumedTrajectories {
    return new ConsumedTrajectories(-Infinity, new Map());
  }

  /** The oldest policy version a sample may have been generated at and still be trained. */
  get horizon(): number {
    return this.horizonVersion;
  }

  /** Ids in the exact tier, and fingerprints in the older one. */
  get size(): { exact: number; older: number } {
    return { exact: this.ids.size, older: this.older.size };
  }

  has(trajectoryId: string): boolean {
    return this.ids.has(trajectoryId) || (this.older.size > 0 && this.older.has(fingerprint(trajectoryId)));
  }

  belowHorizon(version: number): boolean {
    return version < this.horizonVersion;
  }

  /** Record ids (with the version each was generated at) and raise the horizon to `version - bound`. */
  add(taken: Iterable<[string, number]>, version: number, bound: number): void {
    for (const [id, v] of taken) this.ids.set(id, Math.max(v, this.ids.get(id) ?? v));
    this.horizonVersion = Math.max(this.horizonVersion, version - bound);
    for (const [id, v] of this.ids) {
      if (v >= this.horizonVersion) continue;
      this.ids.delete(id);
      const f = fingerprint(id);
      this.older.delete(f);
      this.older.add(f);
    }
    for (const f of this.older) {
      if (this.older.size <= OLDER_CAPACITY) break;
      this.older.delete(f);
    }
  }

  /** The exact tier as `add` would leave it, without changing this set: what a step's checkpoint saves. */
  exactAfter(taken: Iterable<[string, number]>, version: number, bound: number): ConsumedTrajectories {
    const next = new ConsumedTrajectories(this.horizonVersion, new Map(this.ids));
    next.add(taken, version, bound);
    next.older.clear();
    return next;
  }

  /** The exact tier into a step's checkpoint directory, durably (temporary file, fsync, rename), before the step commits. */
  async save(dir: string): Promise<void> {
    const saved: Saved = { horizon: this.horizonVersion, ids: [...this.ids] };
    const tmp = join(dir, `${FILE}.tmp`);
    const fh = await open(tmp, 'w');
    try {
      await fh.writeFile(JSON.stringify(saved));
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, join(dir, FILE));
  }

  /**
   * From a step's checkpoint directory. `set` is null when there is none (a checkpoint written before this file
   * existed) or it cannot be read, with the reason in `problem`: the caller then has the log's TrainSteps alone.
   */
  static async load(dir: string): Promise<{ set: ConsumedTrajectories | null; problem: string | null }> {
    const path = join(dir, FILE);
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      return { set: null, problem: code === 'ENOENT' ? null : `${path} cannot be read (${code ?? String(err)})` };
    }
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch (err) {
      return { set: null, problem: `${path} is not valid JSON (${(err as Error).message})` };
    }
    const s = v as Partial<Saved> | null;
    if (typeof s?.horizon !== 'number' || !Array.isArray(s.ids) || !s.ids.every((e) => Array.isArray(e) && typeof e[0] === 'string' && typeof e[1] === 'number')) {
      return { set: null, problem: `${path} is not {"horizon": n, "ids": [[id, version], ...]}` };
    }
    return { set: new ConsumedTrajectories(s.horizon, new Map(s.ids)), problem: null };
  }
}
