// Messages between the built-in backend and its engine worker threads (engine-workers.ts, engine-worker.ts).
// Weights travel as (name, shape, data) triples; errors as their code and message, rebuilt on arrival.
import { RlstreamError, type ErrorCode } from '../../core/errors.ts';
import type { LogFields, LogLevel } from '../../core/telemetry.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import type { GenerateRequest, GenerateResult } from '../backends/types.ts';
import type { NativeEngineStats } from './native-engine.ts';
import type { EngineSetup, LoadTimes } from './engine-host.ts';

export type WireTensors = [name: string, shape: number[], data: Float32Array][];

export interface WireError {
  code: ErrorCode | null;
  message: string;
  retriable: boolean;
}

export type ToWorker =
  | { t: 'load'; id: number; configJson: string; weights: WireTensors; version: number; setup?: EngineSetup }
  | { t: 'generate'; id: number; request: GenerateRequest }
  | { t: 'abort'; id: number }
  | { t: 'release'; sessionId: string }
  | { t: 'close'; id: number };

export type FromWorker =
  | { t: 'loaded'; id: number; times: LoadTimes; stats: NativeEngineStats }
  | { t: 'result'; id: number; result: GenerateResult; stats: NativeEngineStats }
  | { t: 'failed'; id: number; error: WireError; stats?: NativeEngineStats }
  | { t: 'closed'; id: number }
  | { t: 'log'; level: LogLevel; msg: string; fields: LogFields };

export function toWire(weights: TensorMap): WireTensors {
  return [...weights].map(([name, t]) => [name, t.shape, t.data]);
}

export function fromWire(weights: WireTensors): TensorMap {
  return new Map(weights.map(([name, shape, data]) => [name, { shape, data }]));
}

export function errorToWire(err: unknown): WireError {
  if (err instanceof RlstreamError) return { code: err.code, message: err.message, retriable: err.retriable };
  return { code: null, message: err instanceof Error ? err.message : String(err), retriable: false };
}

export function errorFromWire(e: WireError): Error {
  return e.code ? new RlstreamError(e.code, e.message, { retriable: e.retriable }) : new Error(e.message);
}
