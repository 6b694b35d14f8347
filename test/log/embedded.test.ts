// Runs the log conformance suite against the embedded log, one fresh directory per case.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { logConformance } from './conformance.ts';

logConformance(
  'embedded',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-log-'));
    // Small segments so that the suite also crosses segment boundaries.
    const log = openEmbeddedLog({ dir, segmentBytes: 256 * 1024, indexIntervalBytes: 1024 });
    return {
      log,
      cleanup: async () => {
        await log.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  },
  { deadlineMs: 10_000 },
);
