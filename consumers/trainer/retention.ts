// The trainer's disk retention after each committed step: the newest trainer.keep_checkpoints checkpoints, and the
// weights of every version something may still need (weights-store.ts's mustKeepVersion says which).
import { readdir, rm } from 'node:fs/promises';
import type { Logger } from '../../core/telemetry.ts';
import { checkpointPath } from './commit.ts';
import { mustKeepVersion, pruneWeights } from './weights-store.ts';

/** Delete all but the newest `keep` step checkpoints under `checkpointDir`. */
export async function pruneCheckpoints(checkpointDir: string, keep: number): Promise<void> {
  const names = await readdir(checkpointDir).catch(() => [] as string[]);
  const steps = names.map((n) => /^step-(\d+)$/.exec(n)).filter((m): m is RegExpExecArray => m !== null).map((m) => Number(m[1])).sort((a, b) => b - a);
  for (const s of steps.slice(keep)) await rm(checkpointPath(checkpointDir, s), { recursive: true, force: true });
}

export interface WeightsRetention {
  weightsDir: string;
  /** This run's versions whose weights may still be in the store (version → checksum); pruned ones are removed. */
  stored: Map<number, string>;
  current: number;
  keepVersions: number;
  stalenessBound: number;
  /** [min, max] versions of records read but not yet consumed; asked only when something may go. */
  referenced: () => Promise<[number, number][]>;
  logger: Logger;
}

/**
 * Weights retention: keep the newest trainer.keep_versions versions, every version a sample could still be
 * trained at (within the staleness bound; the rollouts' gate keeps every rollout in flight within it too),
 * and every version named by a record read but not yet consumed. Nothing loads an older version's weights:
 * samples carry their behaviour log-probs, a restart resumes from its checkpoint, and rollouts load the newest.
 */
export async function retainWeights(r: WeightsRetention): Promise<void> {
  const keep0 = { current: r.current, keepVersions: r.keepVersions, stalenessBound: r.stalenessBound, referenced: [] };
  if ([...r.stored.keys()].every((v) => mustKeepVersion(v, keep0))) return;
  const referenced = await r.referenced();
  const gone = await pruneWeights(r.weightsDir, r.stored, (v) => mustKeepVersion(v, { ...keep0, referenced }));
  if (gone.length > 0) r.logger.debug('weights retention', { deleted_versions: gone, kept: [...r.stored.keys()] });
}
