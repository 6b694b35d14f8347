// The reward and advantage consumers SIGKILLed at random moments on Kafka: exactly once (./processor-kills.ts).
import { killTests } from './processor-kills.ts';

killTests('kafka');
