// One rank's share of a data-parallel training step, written against the Collective interface: the trainer's own
// step (step.ts) over its groups' micro-batches on its own model, with the exchange that makes it one rank of many:
// the gradients all-reduced in buckets, the norm clipped (the same on every rank: each holds the same summed
// gradient), a ZeRO-1 AdamW update of its slice and the all-gather. Each rank scales its micro-batches' losses by
// the step's global masked-token count (one all-reduce), so that the summed gradient is the single-process gradient
// of the concatenated batch: exactly so for the token-mean aggregation; the seq-mean aggregations weigh each
// micro-batch by its tokens, in one process as here, so their result depends on how the samples were packed, which
// differs when they are spread over ranks.
//
// The collectives work on the model's own blocks in place (Collective.allReduceBlock and the rest): on a GPU model
// NCCL reduces device memory queued behind the kernels, on a CPU model the host view is the model's memory. ZeRO-1
// is the model's own AdamW given a shard at construction (Model.setOptimizerShard), so a rank's moments are 2/N of
// the trained floats, on whichever device it trains.
import { RlstreamError } from '../../../core/errors.ts';
import type { Model } from '../../../native/index.ts';
import type { TrainSample } from '../batch.ts';
import type { TrainerOptions } from '../options.ts';
import { trainOnBatch, type StepExchange, type StepMetrics } from '../step.ts';
import { allReduceGradients, planBuckets, type BucketPlan } from './buckets.ts';
import { RankFailed, type Collective, type CollectiveDtype } from '../../../native/collectives/collective.ts';
import { FlatLayout } from './flat.ts';

export interface DataParallelOptions {
  /** Bytes of one gradient bucket in its reduction type (PyTorch DDP's bucket_cap_mb is 25 MiB). */
  bucketBytes: number;
  /** The gradients' element type on the wire. */
  dtype: CollectiveDtype;
}

/**
 * The ZeRO-1 cut of `numel` trained floats over `size` ranks: `chunk` floats each (what the all-gather moves), and
 * the `tail` left over (numel mod size) to the last rank, which broadcasts it.
 */
export function zero1Slices(numel: number, size: number): { chunk: number; tail: number; slice: (rank: number) => { begin: number; count: number } } {
  const chunk = Math.floor(numel / size);
  const tail = numel - chunk * size;
  return { chunk, tail, slice: (rank) => ({ begin: rank * chunk, count: chunk + (rank === size - 1 ? tail : 0) }) };
}

export class DataParallelRank {
  readonly plan: BucketPlan;
  /** Where the trained floats are in the parameter block (gradient float i is parameter offset + i). */
  readonly trained: { offset: number; numel: number };
  /** The trained floats whose AdamW moments this rank holds and updates. */
  readonly shard: { begin: number; count: number };
  private readonly slices: ReturnType<typeof zero1Slices>;

  constructor(
    readonly model: Model,
    readonly collective: Collective,
    readonly options: TrainerOptions,
    readonly dp: DataParallelOptions = options.dataParallel,
  ) {
    const who = `data-parallel rank ${collective.rank}`;
    if (options.klCoef > 0) throw new RlstreamError('INPUT_INVALID', `${who}: trainer.kl_coef > 0 needs a reference model on every rank, which the data-parallel step does not hold yet; set trainer.kl_coef: 0`);
    if (model.device === 'cuda' && dp.dtype !== 'fp32') throw new RlstreamError('INPUT_INVALID', `${who}: trainer.data_parallel.reduce_dtype ${dp.dtype} on a GPU model is not built (its gradient block is fp32 and is reduced where it is, with no bf16 copy); set reduce_dtype: fp32`);
    if (model.device === 'cuda' && collective.kind !== 'nccl') throw new RlstreamError('INPUT_INVALID', `${who}: a GPU model's blocks are device memory, which the '${collective.kind}' collective cannot reach; use NCCL`);
    this.trained = model.trainRange();
    this.plan = planBuckets(this.trained.numel, dp.bucketBytes, dp.dtype);
    this.slices = zero1Slices(this.trained.numel, collective.size);
    this.shard = this.slices.slice(collective.rank);
    // Before any step: the moments are allocated for the shard alone (the full ones are dropped).
    model.setOptimizerShard(this.shard.begin, this.shard.count);
  }

  /** Sums the gradients over the ranks, bucket by bucket, last layers first (every rank calls it together). */
  async reduceGradients(): Promise<void> {
    const { model, collective, plan } = this;
    if (plan.dtype === 'bf16') {
      // CPU only (the constructor refuses it on a GPU): staged through bf16 copies of the host view.
      await allReduceGradients(collective, new FlatLayout([this.trained.numel]), [model.blockView('grads')], plan);
      return;
    }
    for (const [s, e] of plan.ranges) await collective.allReduceBlock(model, 'grads', s, e - s);
  }

  /** After each rank's AdamW on its shard: every rank's updated slice of the parameters, to every rank. */
  async gatherParameters(): Promise<void> {
    const { model, collective } = this;
    const { chunk, tail } = this.slices;
    const { offset, numel } = this.trained;
    if (collective.size === 1) return;
    if (chunk > 0) await collective.allGatherBlock(model, 'params', offset, chunk);
    if (tail > 0) await collective.broadcastBlock(model, 'params', offset + chunk * collective.size, tail, collective.size - 1);
    model.paramsWritten(offset, numel);
  }

  /**
   * This rank's part of the step over every rank's samples: the trainer's own step (step.ts) with this rank's
   * exchange. `step` is the number of steps committed before it (the learning rate schedule's position); `samples`
   * may be none (the rank then adds zero gradients). Every rank calls it together.
   */
  step(samples: TrainSample[], step: number): Promise<StepMetrics> {
    const { collective } = this;
    const exchange: StepExchange = {
      sum: (values) => collective.allReduce([values]),
      max: async (values) => {
        const all = new Float32Array(values.length * collective.size);
        await collective.allGather(values, all);
        for (let i = 0; i < values.length; i++) for (let r = 0; r < collective.size; r++) values[i] = Math.max(values[i]!, all[r * values.length + i]!);
      },
      reduceGradients: () => this.reduceGradients(),
      gatherParameters: () => this.gatherParameters(),
    };
    return trainOnBatch(this.model, null, samples, this.options, step, exchange);
  }
}

/**
 * One step on every rank, and its commit on rank 0 only after every rank finished: each rank runs `work`, then
 * all meet at a last all-reduce that counts the ranks done; rank 0 commits (checkpoint, TrainStep, PolicyVersion,
 * offsets, in the trainer's one transaction) only when that count is the whole group, then tells every rank it did. A rank that throws aborts the
 * collective first, so every other rank's pending or next collective fails with RankFailed instead of waiting:
 * no rank commits, and the run resumes from the last committed step. In one process (the reference collective,
 * the tests) `ranks` are run together; across processes each process runs its own rank's part.
 */
export async function rankStepThenCommit<T>(collective: Collective, work: () => Promise<T>, commit: (result: T) => Promise<void>): Promise<T> {
  let inLog = false;
  try {
    const result = await work();
    const done = Float32Array.of(1);
    await collective.allReduce([done]);
    if (done[0] !== collective.size) throw new RlstreamError('INTERNAL', `only ${done[0]} of ${collective.size} ranks finished the step`);
    // Rank 0 says whether its commit went through: a rank never goes on past a step that is not in the log.
    const committed = new Float32Array(1);
    if (collective.rank === 0) {
      await commit(result);
      inLog = true;
      committed[0] = 1;
    }
    await collective.broadcast(committed, 0);
    if (committed[0] !== 1) throw new RlstreamError('INTERNAL', 'rank 0 did not commit the step');
    return result;
  } catch (err) {
    collective.abort(err);
    // rank 0 committed before the failure reached it: the error must not say the step was abandoned
    throw inLog && err instanceof RankFailed ? err.afterCommit() : err;
  }
}
