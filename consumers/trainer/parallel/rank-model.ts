// How the trainer's model is loaded, written once so that every data-parallel rank's process loads the same one:
// the checkpoint of the last committed step, else the warm start, else the run's initial weights (with adapters
// over them under trainer.lora). A rank cuts its optimizer shard between the weights and the moments (`cut`), so
// that it reads its own slice of the moments and no process ever holds all of them.
import { Model, type ModelConfig } from '../../../native/index.ts';
import { loadOptimizerState } from '../../../native/optimizer-state.ts';
import type { TrainerOptions } from '../options.ts';

/** Plain data (it goes to the ranks' processes as it is). */
export interface TrainerModelSpec {
  /** The checkpoint to resume from (the last committed step's), or null on a new run. */
  checkpoint: string | null;
  /** The run's initial weights: version 0, and the frozen base under adapters. */
  initialWeightsPath: string;
  /** A warm start with AdamW moments (SFT), used on a new run without adapters. */
  initialCheckpoint: string | null;
  modelConfig: ModelConfig;
}

/** Where the moments come from: a directory with optimizer.safetensors or shards, or none (a fresh AdamW). */
export function optimizerSource(spec: TrainerModelSpec, options: TrainerOptions): string | null {
  if (spec.checkpoint !== null) return spec.checkpoint;
  return spec.initialCheckpoint !== null && !options.lora ? spec.initialCheckpoint : null;
}

/**
 * The model of `spec` on trainer.device. `cut` (a data-parallel rank's construction) runs after the weights load
 * and before the moments do; without it the model holds every moment, as one process trains.
 */
export async function loadTrainerModel(spec: TrainerModelSpec, options: TrainerOptions, cut?: (model: Model) => void): Promise<Model> {
  const on = { threads: options.threads, device: options.device, recompute: options.recompute };
  const lora = options.lora ? { ...options.lora, seed: 0 } : undefined;
  const from = optimizerSource(spec, options);
  const model = from !== null
    ? await Model.loadCheckpoint(from, { ...on, lora, base: spec.initialWeightsPath, optimizer: false })
    : Model.load(spec.initialWeightsPath, spec.modelConfig, { ...on, lora });
  try {
    cut?.(model);
    if (from !== null) loadOptimizerState(model, from);
  } catch (err) {
    model.dispose();
    throw err;
  }
  return model;
}
