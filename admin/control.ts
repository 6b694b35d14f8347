// The default Control publisher: encodes a Control event and appends it to TOPICS.control keyed by run id
// (so one run's commands stay in order). The main job may pass its own publisher instead.
import { newId } from '../core/ids.ts';
import type { EventLog, Producer } from '../core/log/types.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { TOPICS } from '../core/topics.ts';
import type { ControlRequest, PublishedControl } from './context.ts';

export interface ControlPublisher {
  publish(request: ControlRequest): Promise<PublishedControl>;
  close(): Promise<void>;
}

export function controlPublisher(log: EventLog, serde: EventSerde, now: () => number = Date.now): ControlPublisher {
  let producer: Promise<Producer> | null = null;
  const ready = () =>
    (producer ??= (async () => {
      if (!(await log.listTopics()).some((t) => t.name === TOPICS.control)) await log.createTopic({ name: TOPICS.control, partitions: 1 });
      return log.producer({ idempotent: true });
    })());
  return {
    async publish(request) {
      const eventId = newId();
      const value = serde.encode('Control', { event_id: eventId, time_ms: now(), ...request });
      const [pos] = await (await ready()).send(TOPICS.control, [{ key: request.run_id, value }]);
      return { eventId, partition: pos?.partition ?? 0, offset: pos?.offset ?? -1 };
    },
    async close() {
      if (producer) await (await producer).close();
    },
  };
}
