// One rank's share of a data-parallel training step, written against the Collective interface: its groups'
// micro-batches forward and backward on its own model, the gradients all-reduced in buckets, the norm clipped (the
// same on every rank: each holds the same summed gradient), a ZeRO-1 AdamW update of its slice and the all-gather.
// Each rank scales its micro-batches' losses by the step's global masked-token count (one all-reduce), so that
// the summed gradient is the single-process gradient of the concatenated batch: exactly so for the token-mean
// aggregation; the seq-mean aggregations weigh each micro-batch by its tokens, in one process as here, so their
// result depends on how the samples were packed, which differs when they are spread over ranks.
//
// The parameters are read and written through the model's host views: zero-copy on 'cpu'. On 'cuda' the views are
// host mirrors with no public upload, so this path refuses a 'cuda' model rather than train on stale weights.
import { RlstreamError } from '../../../core/errors.ts';
import type { Model } from '../../../native/index.ts';
import { packMicroBatches, type TrainSample } from '../batch.ts';
import type { TrainerOptions } from '../options.ts';
import { allReduceGradients, planBuckets, type BucketPlan } from './buckets.ts';
import type { Collective, CollectiveDtype } from './collective.ts';
import { FlatLayout } from './flat.ts';
import { Zero1AdamW } from './zero1.ts';

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

export class DataParallelRank {
  readonly layout: FlatLayout;
  readonly plan: BucketPlan;
  readonly optimizer: Zero1AdamW;
  private readonly names: string[];

  constructor(
    readonly model: Model,
    readonly collective: Collective,
    readonly options: TrainerOptions,
    dp: DataParallelOptions = options.dataParallel,
  ) {
    if (options.klCoef > 0) throw new RlstreamError('INPUT_INVALID', `data-parallel rank ${collective.rank}: trainer.kl_coef > 0 needs a reference model on every rank, which the data-parallel step does not hold yet; set trainer.kl_coef: 0`);
    if (model.device !== 'cpu') throw new RlstreamError('INPUT_INVALID', `data-parallel rank ${collective.rank}: a '${model.device}' model's parameters have no public upload from their host views, so the host-view step is built for 'cpu' models only (docs/scaling.md)`);
    const params = model.parameters();
    this.names = [...params.keys()];
    this.layout = new FlatLayout(this.names.map((n) => params.get(n)!.data.length));
    this.plan = planBuckets(this.layout.numel, dp.bucketBytes, dp.dtype);
    this.optimizer = new Zero1AdamW(this.layout, collective);
  }

  private tensors(views: Map<string, { data: Float32Array }>): Float32Array[] {
    return this.names.map((n) => views.get(n)!.data);
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
    const params = this.tensors(model.parameters());
    const grads = this.tensors(model.gradients());
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
        await allReduceGradients(collective, this.layout, grads, this.plan);
        gradNorm += model.clipGradNorm(options.gradClip);
        updates++;
        await this.optimizer.update(params, grads, { lr: options.learningRate, beta1: options.beta1, beta2: options.beta2, eps: options.adamEps, weightDecay: options.weightDecay });
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
