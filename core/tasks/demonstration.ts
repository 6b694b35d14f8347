// A demonstration for supervised warm-up: what a task writes (producers/tasks.ts, examples/) and the SFT trainer
// (consumers/trainer/sft.ts) reads, kept below both so neither imports the other.

export interface SftExample {
  /** The whole conversation's tokens. */
  tokens: number[];
  /** Per token: 1 where the token is trained on (assistant output), else 0; a trajectory's response_mask. */
  responseMask: number[];
}
