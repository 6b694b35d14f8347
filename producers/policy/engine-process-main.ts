// One rollout engine on a GPU of its own (backend.devices), started by engine-processes.ts in the run's process: the
// built-in native policy (NativePolicyBackend: the CUDA engine with its slot KV cache and in-place swaps) behind the
// IPC channel. Where a trainer runs in the run's process, the engine is a member of the weights group: each new
// version's weights (or the trainer's LoRA adapters) are broadcast from the trainer's model into the engine's
// staging copy, device to device over NCCL, and the version's update copies them in as the one-GPU mode does with
// a trainer in its own process. Without the group, versions are read from their files.
import { describeError, RlstreamError } from '../../core/errors.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import type { Collective } from '../../native/collectives/collective.ts';
import { IpcCollective, type CollectiveMessage } from '../../native/collectives/ipc-collective.ts';
import { NcclCollective } from '../../native/collectives/nccl-collective.ts';
import type { EngineFailure, FromEngine, StagePayload, ToEngine } from './engine-process-protocol.ts';
import { NativePolicyBackend } from './native-backend.ts';

function send(m: FromEngine): void {
  // the channel is gone when the run's process is: the disconnect handler ends this process
  if (process.connected) process.send!(m);
}

/**
 * Sends and resolves once the message is handed to the channel: 'receiving' must be out before the receive is
 * queued, since queuing it may block this thread until rank 0 queues its send (NCCL connects a pair of ranks at
 * their first collective), and rank 0 queues it only on 'receiving'.
 */
function sent(m: FromEngine): Promise<void> {
  return new Promise((resolve) => (process.connected ? process.send!(m, () => resolve()) : resolve()));
}

function failure(err: unknown): EngineFailure {
  const e = err instanceof RlstreamError ? err : null;
  return { code: e?.code ?? 'INTERNAL', message: describeError(err), retriable: e?.retriable ?? false };
}

let backend: NativePolicyBackend | null = null;
let group: Collective | null = null;
const calls = new Map<number, AbortController>();
/** init, updates and close in arrival order. */
let work: Promise<void> = Promise.resolve();
/**
 * Broadcasts in arrival order, apart from the updates: an update may wait for turns to finish (rollout.interrupt
 * next_turn), and rank 0's broadcast must not wait with it. A version's update waits for its own receive.
 */
let stages: Promise<void> = Promise.resolve();
const received = new Map<number, Promise<void>>();

async function init(m: Extract<ToEngine, { t: 'init' }>): Promise<void> {
  try {
    if (m.group?.collective === 'nccl') {
      send({ t: 'joining' });
      // the engine sees its own GPU alone (CUDA_VISIBLE_DEVICES names it): it is device 0 here
      group = NcclCollective.join(m.group.ncclId!, m.group.size, m.group.rank, 0);
    } else if (m.group) {
      group = new IpcCollective(m.group.rank, m.group.size, (c: CollectiveMessage) => send(c));
    }
    // warnings and errors, as the run's own default; RLSTREAM_LOG_LEVEL=info shows each version's swap and its source
    const logger = jsonLogger(process.env['RLSTREAM_LOG_LEVEL'] ? {} : { level: 'warn' }).child({ role: 'policy', engine: m.server });
    backend = NativePolicyBackend.create(
      { configJson: m.configJson, weightsPath: m.weightsPath, version: m.version },
      { device: m.device, maxBatch: m.maxBatch, ...(m.maxLen !== null ? { maxLen: m.maxLen } : {}), gpuMemoryUtilization: m.gpuMemoryUtilization, interrupt: m.interrupt, stagesTrainerWeights: m.group?.carries === 'params', server: m.server, logger },
    );
    if (m.group?.carries === 'params') backend.prepareStaging();
    send({ t: 'ready' });
  } catch (err) {
    send({ t: 'start-failed', error: describeError(err) });
    group?.abort(err);
  }
}

function generate(m: Extract<ToEngine, { t: 'generate' }>): void {
  const ac = new AbortController();
  calls.set(m.id, ac);
  backend!.generate(m.request, ac.signal).then(
    (result) => send({ t: 'result', id: m.id, result, stats: backend!.stats() }),
    (err: unknown) => send({ t: 'failed', id: m.id, error: failure(err) }),
  ).finally(() => calls.delete(m.id));
}

/**
 * Takes part in rank 0's broadcast of a version: says 'receiving' as it queues its part (rank 0 queues its own only
 * then, so a stopped engine never holds rank 0's GPU), and 'staged' when the weights are in. A failure before 'receiving' (no memory for the staging copy)
 * keeps rank 0 from broadcasting at all; the version's update then reads the file.
 */
async function stage(version: number, payload: StagePayload): Promise<void> {
  const b = backend!;
  const g = group!;
  try {
    if (payload.kind === 'params') {
      await b.receiveWeights(version, async (staging) => {
        await sent({ t: 'receiving', version });
        await g.broadcastBlock(staging, 'params', 0, payload.count, 0);
        staging.paramsWritten(0, payload.count);
      });
    } else {
      const floats = new Float32Array(payload.count);
      await sent({ t: 'receiving', version });
      await g.broadcast(floats, 0);
      b.receiveAdapters(version, { tensors: payload.layout.map((t) => [t.name, floats.subarray(t.offset, t.offset + t.length)]), rank: payload.rank, alpha: payload.alpha });
    }
    send({ t: 'staged', version, error: null });
  } catch (err) {
    send({ t: 'staged', version, error: describeError(err) });
  }
}

async function update(m: Extract<ToEngine, { t: 'update' }>): Promise<void> {
  try {
    await received.get(m.update.version);
    // (a version whose step was never committed has a receive and no update)
    for (const v of received.keys()) if (v <= m.update.version) received.delete(v);
    await backend!.updatePolicy(m.update);
    send({ t: 'updated', id: m.id, stats: backend!.stats() });
  } catch (err) {
    send({ t: 'update-failed', id: m.id, error: failure(err) });
  }
}

process.on('message', (m: ToEngine) => {
  switch (m.t) {
    case 'coll-done':
    case 'coll-failed':
      (group as IpcCollective | null)?.onReply(m);
      break;
    case 'init':
      work = work.then(() => init(m));
      break;
    case 'generate':
      if (backend) generate(m);
      else send({ t: 'failed', id: m.id, error: { code: 'BACKEND_UNAVAILABLE', message: 'the engine has not loaded its model', retriable: true } });
      break;
    case 'abort':
      calls.get(m.id)?.abort(new RlstreamError('BACKEND_UNAVAILABLE', 'aborted by the caller', { retriable: false }));
      break;
    case 'release':
      backend?.releaseSession(m.sessionId);
      break;
    case 'stage': {
      const done = (stages = stages.then(() => stage(m.version, m.payload)));
      received.set(m.version, done);
      break;
    }
    case 'update':
      work = work.then(() => update(m));
      break;
    case 'close':
      work = work.then(async () => {
        for (const ac of calls.values()) ac.abort(new RlstreamError('BACKEND_UNAVAILABLE', 'the engine is closing', { retriable: true }));
        await backend?.close().catch(() => {});
        await group?.close().catch(() => {});
        process.exit(0);
      });
      break;
  }
});
// The run's process is gone (it exited or was killed): nothing generated here can reach the log.
process.on('disconnect', () => process.exit(1));
send({ t: 'hello' });
