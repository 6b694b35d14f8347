// Runs the shared event-log conformance suite (test/log/conformance.ts) against a real Kafka broker.
import { logConformance } from '../log/conformance.ts';
import { openTestKafkaLog, service } from './services.ts';

const brokers = service('KAFKA_BROKERS', 'Kafka event log conformance');
if (brokers) {
  logConformance('kafka', async () => {
    const log = await openTestKafkaLog(brokers);
    return { log, cleanup: () => log.close() };
  });
}
