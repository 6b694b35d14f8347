// The order in which a built-in backend takes policy versions, whatever engine holds the weights: one update at
// a time, in the order they arrive; a version not newer than the one served is skipped with a warning (a follower
// that reopened its consumer reads versions again); a failed update is the caller's error and does not block the
// updates after it.
import { isDeepStrictEqual } from 'node:util';
import { RlstreamError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { PolicyUpdate } from '../backends/types.ts';

export class PolicyUpdates {
  private tail: Promise<void> = Promise.resolve();

  constructor(
    private readonly current: () => number,
    private readonly logger: Logger,
  ) {}

  /** Runs `load` after the updates before it, unless `update` is not newer than the version served then. */
  apply(update: PolicyUpdate, load: () => Promise<void>): Promise<void> {
    const next = this.tail.then(async () => {
      if (update.version <= this.current()) {
        this.logger.warn('ignoring a policy update that is not newer', { version: update.version, current: this.current() });
        return;
      }
      await load();
    });
    this.tail = next.catch(() => {});
    return next;
  }

  /**
   * Refuses a version whose model config (`next`, parsed from the update) differs in any field from the one served:
   * built-in backends only swap weights.
   */
  static checkArchitecture(update: PolicyUpdate, next: ParsedModelConfig, served: ParsedModelConfig): void {
    // by value: rope_scaling is an object parsed anew for every update
    const same = (Object.keys(next) as (keyof ParsedModelConfig)[]).every((k) => isDeepStrictEqual(next[k], served[k]));
    if (!same) throw new RlstreamError('WEIGHTS_FORMAT', `policy v${update.version} changes the model architecture; the built-in policy only swaps weights`);
  }

  /** Refuses a version published as adapters, for a backend that only loads whole weights. */
  static refuseAdapter(update: PolicyUpdate, backend: string): void {
    if (update.adapter)
      throw new RlstreamError('WEIGHTS_FORMAT', `policy v${update.version} is published as LoRA adapters (trainer.lora); the ${backend} backend loads whole weights only: use backend.name builtin with backend.engine native, or train without trainer.lora`);
  }

  /** Resolves when every update applied so far has finished (failed ones included). */
  settled(): Promise<void> {
    return this.tail;
  }
}
