// Runs the shared event-log conformance suite (test/log/conformance.ts) against a real Kafka broker, on each
// Kafka client (kafkajs, librdkafka).
import { logConformance } from '../log/conformance.ts';
import { kafkaClients, openTestKafkaLog, service } from './services.ts';

const brokers = service('KAFKA_BROKERS', 'Kafka event log conformance');
if (brokers) {
  for (const client of kafkaClients('Kafka event log conformance')) {
    logConformance(`kafka (${client})`, async () => {
      const log = await openTestKafkaLog(brokers, client);
      return { log, cleanup: () => log.close() };
    });
  }
}
