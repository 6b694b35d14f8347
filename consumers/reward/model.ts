// Model-based rewards: a reward model in ONNX scoring token ids with onnxruntime-node, a batch at a time (the
// reward consumer collects up to B trajectories or T ms, then calls score() once).
// Model contract: input `input_ids` int64 [B, L] (right-padded with padId), optional `attention_mask` int64
// [B, L] (1 for real tokens); the first output holds one score per row ([B] or [B, 1]).
import * as ort from 'onnxruntime-node';
import { RlstreamError } from '../../core/errors.ts';

export interface BatchScorer {
  readonly name: string;
  score(sequences: ArrayLike<number>[]): Promise<number[]>;
  close?(): Promise<void>;
}

export interface OnnxRewardModelOptions {
  /** Keep at most this many tokens per sequence (the tail, where the answer is). Default 4096. */
  maxLength?: number;
  padId?: number;
  /** Name in RewardInfo.reward_fn and in the component. Default `rm:<file name>`. */
  name?: string;
}

export class OnnxRewardModel implements BatchScorer {
  private constructor(
    private readonly session: ort.InferenceSession,
    readonly name: string,
    private readonly maxLength: number,
    private readonly padId: number,
  ) {}

  static async load(path: string, options: OnnxRewardModelOptions = {}): Promise<OnnxRewardModel> {
    let session: ort.InferenceSession;
    try {
      session = await ort.InferenceSession.create(path);
    } catch (cause) {
      throw new RlstreamError('CONFIG_INVALID', `reward model ${path} cannot be loaded: ${(cause as Error).message}`, { cause });
    }
    if (!session.inputNames.includes('input_ids')) throw new RlstreamError('CONFIG_INVALID', `reward model ${path} has no input_ids input (inputs: ${session.inputNames.join(', ')})`);
    const name = options.name ?? `rm:${path.split('/').pop()}`;
    return new OnnxRewardModel(session, name, options.maxLength ?? 4096, options.padId ?? 0);
  }

  async score(sequences: ArrayLike<number>[]): Promise<number[]> {
    const B = sequences.length;
    if (B === 0) return [];
    const L = Math.max(1, ...sequences.map((s) => Math.min(s.length, this.maxLength)));
    const ids = new BigInt64Array(B * L).fill(BigInt(this.padId));
    const mask = new BigInt64Array(B * L);
    sequences.forEach((s, b) => {
      const start = Math.max(0, s.length - this.maxLength);
      for (let t = start; t < s.length; t++) {
        ids[b * L + t - start] = BigInt(s[t]!);
        mask[b * L + t - start] = 1n;
      }
    });
    const feeds: Record<string, ort.Tensor> = { input_ids: new ort.Tensor('int64', ids, [B, L]) };
    if (this.session.inputNames.includes('attention_mask')) feeds['attention_mask'] = new ort.Tensor('int64', mask, [B, L]);
    const result = await this.session.run(feeds);
    const out = result[this.session.outputNames[0]!];
    if (!out || out.data.length !== B) throw new RlstreamError('REWARD_FAILED', `reward model ${this.name} returned ${out?.data.length ?? 0} scores for ${B} sequences`);
    return Array.from(out.data as Float32Array, Number);
  }

  async close(): Promise<void> {
    await this.session.release();
  }
}
