// What the trainer has consumed, by trajectory id: the trajectories its committed steps took (trained, or dropped
// as stale). A record of one of them that comes again — re-delivered after a damaged log was repaired, re-read
// from a rewound offset, published twice by a producer — is skipped and counted instead of trained twice.
//
// It is part of the trainer's durable state: each step's checkpoint holds it (consumed.json, written before the
// step's transaction commits), and a restart merges that with the ids the log's TrainSteps list, so either one
// surviving damage is enough.
//
// Bounded by the staleness bound: a sample generated at policy version v trains only while v >= version - bound,
// so below that horizon an id can never be trained again and is forgotten; the set holds about (bound + 1) steps'
// trajectories. The horizon only rises: after set_staleness raises the bound, a sample below the horizon is still
// dropped as stale, since whether it was trained before can no longer be told.
import { open, readFile, rename } from 'node:fs/promises';
import { join } from 'node:path';

const FILE = 'consumed.json';

interface Saved {
  horizon: number;
  /** [trajectory id, policy version it was generated at (an upper bound of it for ids read from TrainSteps)]. */
  ids: [string, number][];
}

export class ConsumedTrajectories {
  private constructor(
    private horizonVersion: number,
    private readonly ids: Map<string, number>,
  ) {}

  static empty(): ConsumedTrajectories {
    return new ConsumedTrajectories(0, new Map());
  }

  /** The oldest policy version a sample may have been generated at and still be trained. */
  get horizon(): number {
    return this.horizonVersion;
  }

  get size(): number {
    return this.ids.size;
  }

  has(trajectoryId: string): boolean {
    return this.ids.has(trajectoryId);
  }

  belowHorizon(version: number): boolean {
    return version < this.horizonVersion;
  }

  /** Record ids (with the version each was generated at) and raise the horizon to `version - bound`. */
  add(taken: Iterable<[string, number]>, version: number, bound: number): void {
    for (const [id, v] of taken) this.ids.set(id, Math.max(v, this.ids.get(id) ?? v));
    this.horizonVersion = Math.max(this.horizonVersion, version - bound);
    for (const [id, v] of this.ids) if (v < this.horizonVersion) this.ids.delete(id);
  }

  copy(): ConsumedTrajectories {
    return new ConsumedTrajectories(this.horizonVersion, new Map(this.ids));
  }

  /** Into a step's checkpoint directory, durably (temporary file, fsync, rename), before the step commits. */
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
