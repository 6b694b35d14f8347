// One engine worker thread: an InProcessEngine serving the requests the backend routes here. Started through
// engine-worker.mjs, which registers the TypeScript loader first.
import { parentPort } from 'node:worker_threads';
import type { LogFields, Logger, LogLevel } from '../../core/telemetry.ts';
import { parseModelConfig } from '../../core/weights/model-config.ts';
import { InProcessEngine } from './engine-host.ts';
import { errorToWire, fromWire, type FromWorker, type ToWorker } from './engine-worker-protocol.ts';

const port = parentPort;
if (!port) throw new Error('engine-worker.ts runs in a worker thread');
let engine: InProcessEngine | null = null;
const aborts = new Map<number, AbortController>();
const send = (m: FromWorker) => port.postMessage(m);

/** The engine's log lines go to the backend's logger in the main thread (fields must be cloneable). */
function portLogger(bound: LogFields = {}): Logger {
  const line = (level: LogLevel) => (msg: string, fields: LogFields = {}) => send({ t: 'log', level, msg, fields: { ...bound, ...fields } });
  return { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error'), child: (fields) => portLogger({ ...bound, ...fields }) };
}

port.on('message', (m: ToWorker) => {
  void handle(m);
});

async function handle(m: ToWorker): Promise<void> {
  switch (m.t) {
    case 'load': {
      try {
        const config = parseModelConfig(m.configJson);
        const weights = fromWire(m.weights);
        if (!engine) {
          if (!m.setup) throw new Error('the first load carries the engine set-up');
          engine = await InProcessEngine.create(config, weights, m.version, m.setup, portLogger());
          send({ t: 'loaded', id: m.id, times: engine.first, stats: engine.stats() });
        } else {
          const times = await engine.load(config, weights, m.version);
          send({ t: 'loaded', id: m.id, times, stats: engine.stats() });
        }
      } catch (err) {
        send({ t: 'failed', id: m.id, error: errorToWire(err) });
      }
      return;
    }
    case 'generate': {
      const ac = new AbortController();
      aborts.set(m.id, ac);
      try {
        const result = await engine!.generate(m.request, ac.signal);
        send({ t: 'result', id: m.id, result, stats: engine!.stats() });
      } catch (err) {
        send({ t: 'failed', id: m.id, error: errorToWire(err), stats: engine!.stats() });
      } finally {
        aborts.delete(m.id);
      }
      return;
    }
    case 'abort':
      aborts.get(m.id)?.abort();
      return;
    case 'release':
      engine?.releaseSession(m.sessionId);
      return;
    case 'close':
      await engine?.close();
      send({ t: 'closed', id: m.id });
      return;
  }
}
