// The messages between a run's process and the rollout engines it starts on other GPUs (engine-processes.ts forks
// engine-process-main.ts once per backend.devices entry), over the IPC channel of child_process.fork with the
// 'advanced' serialization (typed arrays travel as they are). Plain data only.
import type { CollectiveMessage, CollectiveReply } from '../../native/collectives/ipc-collective.ts';
import type { GenerateRequest, GenerateResult, PolicyUpdate } from '../backends/types.ts';
import type { NativeEngineStats, RolloutInterrupt } from './native-engine.ts';

/**
 * The weights group: the trainer's process (rank 0, the root of every broadcast) and the engines (ranks 1..E).
 * 'nccl': each engine joins with `ncclId` on its own GPU (device 0 of its process); 'reference': the group meets in
 * the run's process over the channel (CPU engines, the tests).
 */
export interface WeightsGroupInit {
  collective: 'nccl' | 'reference';
  ncclId: Uint8Array | null;
  rank: number;
  size: number;
  /** What the broadcasts carry: every parameter (the engine keeps a staging copy for them) or LoRA adapters. */
  carries: 'params' | 'adapters';
}

/** What a version's broadcast carries: every parameter, or the trainer's LoRA adapters only. */
export type StagePayload =
  | { kind: 'params'; count: number }
  | {
      kind: 'adapters';
      count: number;
      /** The adapter tensors in the broadcast floats: names as in an adapter file, offsets from the first float. */
      layout: { name: string; offset: number; length: number }[];
      rank: number;
      alpha: number;
    };

export type ToEngine =
  | {
      t: 'init';
      configJson: string;
      weightsPath: string;
      version: number;
      device: 'cuda' | 'cpu';
      maxBatch: number;
      maxLen: number | null;
      gpuMemoryUtilization: number;
      interrupt: RolloutInterrupt;
      /** The engine's name in results and logs (the server manager's address for it). */
      server: string;
      group: WeightsGroupInit | null;
    }
  | { t: 'generate'; id: number; request: GenerateRequest }
  | { t: 'abort'; id: number }
  | { t: 'release'; sessionId: string }
  | { t: 'update'; id: number; update: PolicyUpdate }
  /** Version `version`'s weights are being broadcast from rank 0 now: receive them into the staging copy. */
  | { t: 'stage'; version: number; payload: StagePayload }
  | { t: 'close' }
  | CollectiveReply;

export interface EngineFailure {
  code: string;
  message: string;
  retriable: boolean;
}

export type FromEngine =
  /** The process listens: a message sent before it would be lost (the child loads its modules first). */
  | { t: 'hello' }
  /** About to join NCCL (commInit blocks until every rank joins, rank 0 too). */
  | { t: 'joining' }
  | { t: 'ready' }
  | { t: 'start-failed'; error: string }
  | { t: 'result'; id: number; result: GenerateResult; stats: NativeEngineStats }
  | { t: 'failed'; id: number; error: EngineFailure }
  | { t: 'updated'; id: number; stats: NativeEngineStats }
  | { t: 'update-failed'; id: number; error: EngineFailure }
  /**
   * The engine is queuing its part of the version's broadcast now: rank 0 queues its own only once every engine has
   * said so, so that no broadcast of the trainer's waits on an engine that never takes part (stopped, failed).
   */
  | { t: 'receiving'; version: number }
  /** The version's broadcast was received (on a GPU: queued behind the engine's kernels), or failed. */
  | { t: 'staged'; version: number; error: string | null }
  | CollectiveMessage;
