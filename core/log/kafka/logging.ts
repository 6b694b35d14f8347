// Routes kafkajs's own log lines into our Logger instead of its default console output. kafkajs logs at ERROR
// for conditions it then retries (a rebalance, a lost connection); those become warnings here, because the
// failure that matters reaches the caller as a thrown error.
import { logLevel, type LogEntry, type logCreator } from 'kafkajs';
import type { Logger } from '../../telemetry.ts';

export const KAFKAJS_LEVEL = {
  nothing: logLevel.NOTHING,
  error: logLevel.ERROR,
  warn: logLevel.WARN,
  info: logLevel.INFO,
  debug: logLevel.DEBUG,
} as const;

export function kafkajsLogCreator(logger: Logger): logCreator {
  return () =>
    ({ namespace, level, log }: LogEntry) => {
      const { message, timestamp: _t, logger: _l, ...fields } = log;
      const f = { component: 'kafkajs', namespace, ...fields };
      if (level === logLevel.ERROR || level === logLevel.WARN) logger.warn(message, f);
      else if (level === logLevel.INFO) logger.info(message, f);
      else logger.debug(message, f);
    };
}
