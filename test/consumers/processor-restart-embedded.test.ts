// The reward and advantage consumers SIGKILLed at random moments on the embedded log: exactly once
// (./processor-kills.ts).
import { killTests } from './processor-kills.ts';

killTests('embedded');
