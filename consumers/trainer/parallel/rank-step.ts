// One rank's share of a data-parallel training step, written against the Collective interface: its groups'
// micro-batches forward and backward on its own model, the gradients all-reduced in buckets, the norm clipped (the
// same on every rank: each holds the same summed gradient), a ZeRO-1 AdamW update of its slice and the all-gather.
// Each rank scales its micro-batches' losses by the step's global masked-token count (one all-reduce), so that
// the summed gradient is the single-process gradient of the concatenated batch: exactly so for the token-mean
// aggregation; the seq-mean aggregations weigh each micro-batch by its tokens, in one process as here, so their
// result depends on how the samples were packed, which differs when they are spread over ranks.
//
// The collectives work on the model's own blocks in place (Collective.allReduceBlock and the rest): on a GPU model
// NCCL reduces device memory queued behind the kernels, on a CPU model the host view is the model's memory. ZeRO-1
// is the model's own AdamW given a shard at construction (Model.setOptimizerShard), so a rank's moments are 2/N of
// the trained floats, on whichever device it trains.
import { RlstreamError } from '../../../core/errors.ts';
import type { Model } from '../../../native/index.ts';
import { packMicroBatches, type TrainSample } from '../batch.ts';
import type { TrainerOptions } from '../options.ts';
import { allReduceGradients, planBuckets, type BucketPlan } from './buckets.ts';
import type { Collective, CollectiveDtype } from './collective.ts';
import { FlatLayout } from './flat.ts';

export interface DataParallelOptions {
  /** Bytes of one gradient bucket in its reduction type (PyTorch DDP's bucket_cap_mb is 25 MiB). */
  bucketBytes: number;
  /** The gradients' element type on the wire. */
  dtype: CollectiveDtype;
}

export interface RankStepMetrics {
  /** The step's metrics over every rank's samples (sums over ranks of the masked-token-weighted values). */
  loss: number;
  pgLoss: number;
  entropy: number;
  approxKl: number;
  clipFraction: number;
  /** The largest importance weight on any rank. */
  iwMax: number;
  /** Mean over the step's updates of the summed gradient's norm before clipping. */
  gradNorm: number;
  /** Masked tokens of the step, every rank's. */
  maskedTokens: number;
  /** This rank's own masked tokens. */
  rankMaskedTokens: number;
  updates: number;
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

  /** The step over this rank's samples (possibly none: the rank then adds zero gradients). Every rank calls it together. */
  async step(samples: TrainSample[]): Promise<RankStepMetrics> {
    const { model, collective, options } = this;
    const micro = packMicroBatches(samples, options.maxTokensPerMicroBatch);
    const prox = [];
    for (const mb of micro) prox.push((await model.forward(mb, mb.targets)).logprobs);
    const rankMasked = micro.reduce((n, mb) => n + mb.maskedTokens, 0);
    // Every rank makes the same number of updates: mini-batch m is each rank's m-th share of its micro-batches.
    const perMini = Math.max(1, Math.ceil(micro.length / options.miniBatches));
    const chunks = Array.from({ length: options.miniBatches }, (_, m) => micro.slice(m * perMini, (m + 1) * perMini).map((mb, j) => ({ mb, k: m * perMini + j })));
    // One all-reduce for every count the loss scales need: the step's and each mini-batch's masked tokens.
    const counts = Float32Array.from([rankMasked, ...chunks.map((c) => c.reduce((n, { mb }) => n + mb.maskedTokens, 0))]);
    await collective.allReduce([counts]);
    const totalMasked = counts[0]!;
    const sums = new Float32Array(5); // loss, pgLoss, entropy, approxKl, clipFraction
    let iwMax = 0;
    let gradNorm = 0;
    let updates = 0;
    const loss = options.policyLoss;
    for (let epoch = 0; epoch < options.ppoEpochs; epoch++) {
      for (let m = 0; m < chunks.length; m++) {
        const chunkMasked = counts[1 + m]! || 1;
        model.zeroGrad();
        for (const { mb, k } of chunks[m]!) {
          const r = await model.backwardPolicyLoss(
            mb,
            { targets: mb.targets, responseMask: mb.responseMask, advantages: mb.advantages, behaviourLogprobs: mb.behaviourLogprobs, proximalLogprobs: prox[k]! },
            {
              loss: loss.loss,
              clipLow: loss.clipLow,
              clipHigh: loss.clipHigh,
              dualClipC: loss.dualClipC,
              correction: options.rolloutCorrection,
              klCoef: 0,
              klType: options.klType,
              entropyCoef: options.entropyCoef,
              aggregation: options.aggregation,
              lossScale: mb.maskedTokens / chunkMasked,
            },
          );
          const w = mb.maskedTokens / ((totalMasked || 1) * options.ppoEpochs);
          sums[0]! += r.loss * w;
          sums[1]! += r.pgLoss * w;
          sums[2]! += r.entropy * w;
          sums[3]! += r.approxKl * w;
          sums[4]! += r.clipFraction * w;
          iwMax = Math.max(iwMax, r.iwMax);
        }
        await this.reduceGradients();
        gradNorm += model.clipGradNorm(options.gradClip);
        updates++;
        await model.adamwStep({ lr: options.learningRate, beta1: options.beta1, beta2: options.beta2, eps: options.adamEps, weightDecay: options.weightDecay });
        await this.gatherParameters();
      }
    }
    const maxes = new Float32Array(collective.size);
    await collective.allReduce([sums]);
    await collective.allGather(Float32Array.of(iwMax), maxes);
    return {
      loss: sums[0]!,
      pgLoss: sums[1]!,
      entropy: sums[2]!,
      approxKl: sums[3]!,
      clipFraction: sums[4]!,
      iwMax: Math.max(...maxes),
      gradNorm: gradNorm / Math.max(1, updates),
      maskedTokens: totalMasked,
      rankMaskedTokens: rankMasked,
      updates,
    };
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
  try {
    const result = await work();
    const done = Float32Array.of(1);
    await collective.allReduce([done]);
    if (done[0] !== collective.size) throw new RlstreamError('INTERNAL', `only ${done[0]} of ${collective.size} ranks finished the step`);
    // Rank 0 says whether its commit went through: a rank never goes on past a step that is not in the log.
    const committed = new Float32Array(1);
    if (collective.rank === 0) {
      await commit(result);
      committed[0] = 1;
    }
    await collective.broadcast(committed, 0);
    if (committed[0] !== 1) throw new RlstreamError('INTERNAL', 'rank 0 did not commit the step');
    return result;
  } catch (err) {
    collective.abort(err);
    throw err;
  }
}
