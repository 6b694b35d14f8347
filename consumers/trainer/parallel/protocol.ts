// The messages between the trainer's process (rank 0: it reads the log, decides each step's groups and commits)
// and the processes of ranks 1..N-1 (rank-main.ts), over the IPC channel of child_process.fork with the 'advanced'
// serialization (typed arrays travel as they are). Plain data only.
import type { TrainSample } from '../batch.ts';
import type { TrainerOptions } from '../options.ts';
import type { CollectiveMessage, CollectiveReply } from '../../../native/collectives/ipc-collective.ts';
import type { TrainerModelSpec } from './rank-model.ts';

/** Rank 0 → rank r. */
export type ToRank =
  | {
      t: 'init';
      rank: number;
      size: number;
      /** 'nccl': join with `ncclId` on the process's first GPU; 'reference': the collective through rank 0 (ipc-collective.ts). */
      collective: 'nccl' | 'reference';
      ncclId: Uint8Array | null;
      spec: TrainerModelSpec;
      options: TrainerOptions;
    }
  | {
      t: 'step';
      /** The number of steps committed before this one (the learning-rate schedule's position). */
      committed: number;
      /** Whether the step trains (false: only stale samples; every rank still writes its optimizer shard). */
      train: boolean;
      samples: TrainSample[];
      /** The step's checkpoint directory, where the rank writes its optimizer shard before the commit. */
      checkpointDir: string;
    }
  | { t: 'close' }
  | CollectiveReply;

/** Rank r → rank 0. */
export type FromRank =
  /** The rank's process listens: a message sent before it would be lost (the child loads its modules first). */
  | { t: 'hello' }
  | { t: 'joining' }
  | { t: 'ready' }
  | { t: 'start-failed'; error: string }
  | { t: 'step-done' }
  | { t: 'step-failed'; error: string }
  | CollectiveMessage;
