// `rlstream log`: maintenance of an embedded log directory. `check` compares the files with what the log says it
// wrote (its manifest, checkpoint, journal and damage ledgers) and checks every record's frame, without writing:
// every offset range lost and not yet repaired, every file that is not the log's own, committed offsets past
// the end, a stale LOCK; exit 1 when there is any. `repair` quarantines all of it (see
// core/log/embedded/repair.ts) and lists every range lost; `check` then exits 0, listing what was accepted.
import type { Command } from 'commander';
import { describeError } from '../../core/errors.ts';
import { describeDamage } from '../../core/log/embedded/damage-report.ts';
import type { DamageReport } from '../../core/log/embedded/index.ts';
import { checkLog, repairLog } from '../../core/log/embedded/repair.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { resolveEmbeddedLog } from '../run-dir.ts';

const warnLogger = (role: string) => jsonLogger({ level: 'warn', fields: { role }, write: (l) => process.stderr.write(l + '\n') });

export function register(program: Command): void {
  const log = program.command('log').description('maintain an embedded event log directory');
  log
    .command('repair <dir>')
    .description('open a damaged embedded log (a run directory or its log/), listing every offset range lost in damage.json and moving aside what is not the log\'s own (damaged records, segments it did not write, files of the wrong type, a stale LOCK); prints every range lost')
    .action(async (given: string) => {
      // A run directory stands for its log/: opened as a log itself, an empty one would be created inside the run.
      const dir = resolveEmbeddedLog(given, undefined, 'log repair').log;
      const report = await repairLog(dir, warnLogger('log-repair'));
      const { lines } = describeDamage(report, 'repair');
      const nothing = report.foundNow.length === 0 && report.extra.length === 0 && report.clamped.length === 0 && !report.lock;
      console.log(`rlstream log repair: ${dir}: ${nothing ? 'nothing to repair' : 'repaired'}${lines.length > 0 ? `\n${lines.join('\n')}` : ''}`);
    });
  log
    .command('check <dir>')
    .description('compare an embedded log (a run directory or its log/) with what it wrote and check every record, without writing to it; lists every offset range lost, every file not its own, a stale LOCK; exit 1 when there is any or it cannot be opened')
    .action(async (given: string) => {
      let report: DamageReport;
      let dir = given;
      try {
        dir = resolveEmbeddedLog(given, undefined, 'log check').log;
        report = await checkLog(dir, warnLogger('log-check'));
      } catch (err) {
        console.log(`rlstream log check: ${dir}: ${describeError(err)}`);
        process.exitCode = 1;
        return;
      }
      const { lines, problems } = describeDamage(report, 'check');
      console.log(`rlstream log check: ${dir}: ${problems === 0 ? 'no damage found' : `${problems} problem(s) found; \`rlstream log repair ${dir}\` lists and quarantines them`}${lines.length > 0 ? `\n${lines.join('\n')}` : ''}`);
      if (problems > 0) process.exitCode = 1;
    });
}
