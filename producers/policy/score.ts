// Teacher-forced scoring with the exported graph ('all' mode): the log-prob of every token of a sequence given
// its prefix, as the trainer recomputes it. Used for parity with the native forward and for the mismatch metric.
import { emptyKv, type PolicyRunner } from './runner.ts';
import { MASKED } from './export.ts';

/**
 * The whole distribution after every prefix: log_softmax(logits) at each position of each sequence, as
 * [batch, seq, vocab] rows (seq: the longest sequence; the rows past a shorter one's end are padding).
 * `runner` must have been created with mode 'all'. Sequences are batched right-padded.
 */
export async function logprobRows(runner: PolicyRunner, sequences: number[][]): Promise<{ rows: Float32Array; seq: number }> {
  const B = sequences.length;
  const S = sequences.reduce((m, s) => Math.max(m, s.length), 0);
  const ids = new BigInt64Array(B * S);
  const pos = new BigInt64Array(B * S);
  const bias = new Float32Array(B * S * S).fill(MASKED);
  sequences.forEach((seq, b) => {
    for (let i = 0; i < S; i++) {
      const row = (b * S + i) * S;
      if (i < seq.length) {
        ids[b * S + i] = BigInt(seq[i]!);
        pos[b * S + i] = BigInt(i);
        bias.fill(0, row, row + i + 1);
      } else bias[row + i] = 0; // padding: attend to itself only
    }
  });
  const out = await runner.step({ batch: B, seq: S, inputIds: ids, positionIds: pos, bias, past: emptyKv(runner.config) });
  return { rows: out.logprobs, seq: S };
}

/**
 * For each sequence, out[t] = log p(tokens[t + 1] | tokens[0..t]) for t in [0, n - 1) (length n - 1).
 * `runner` must have been created with mode 'all'. Sequences are batched right-padded.
 */
export async function scoreSequences(runner: PolicyRunner, sequences: number[][]): Promise<Float32Array[]> {
  const V = runner.config.vocab_size;
  const { rows, seq: S } = await logprobRows(runner, sequences);
  return sequences.map((seq, b) => {
    const lp = new Float32Array(Math.max(0, seq.length - 1));
    for (let t = 0; t + 1 < seq.length; t++) lp[t] = rows[(b * S + t) * V + seq[t + 1]!]!;
    return lp;
  });
}
