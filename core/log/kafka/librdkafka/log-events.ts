// librdkafka's own log lines (its `event.log` events) into our Logger. Without a listener the binding drops them:
// log.clientLogLevel and log.clientDebug would then change nothing that anyone could read.
import type { Logger } from '../../../telemetry.ts';
import type { RdLogEvent } from './binding.ts';

/** What a client that emits librdkafka's log events offers (producers and consumers alike). */
interface LogEmitter {
  on(event: 'event.log', listener: (e: RdLogEvent) => void): void;
}

/**
 * Routes a client's log events into `logger`: syslog severities 0-3 as errors, 4 as warnings, 5-6 as info, 7
 * (the debug contexts) as debug. librdkafka filters by its log_level before the event is made (rdBaseConfig).
 */
export function routeRdLogs(client: LogEmitter, logger: Logger, who: string): void {
  client.on('event.log', (e) => {
    const fields = { client: who, fac: e.fac, librdkafka: e.name };
    if (e.severity <= 3) logger.error(e.message, fields);
    else if (e.severity === 4) logger.warn(e.message, fields);
    else if (e.severity <= 6) logger.info(e.message, fields);
    else logger.debug(e.message, fields);
  });
}
