// `rlstream log`: maintenance of an embedded log directory. `repair` quarantines whatever damage an open refuses
// (see core/log/embedded/repair.ts) and prints what was lost; `check` reports damage without writing anything
// and exits 1 when the log has lost records or cannot be opened.
import type { Command } from 'commander';
import { describeError } from '../../core/errors.ts';
import type { DamageReport } from '../../core/log/embedded/index.ts';
import { checkLog, repairLog } from '../../core/log/embedded/repair.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { resolveEmbeddedLog } from '../run-dir.ts';

function summary(report: DamageReport): string {
  const lines = report.gaps.map(
    (g) => `  ${g.topic}/${g.partition} offsets ${g.fromOffset}..${g.toOffset === null ? 'end' : g.toOffset - 1}: ${g.reason} (${g.bytes} bytes${g.quarantine ? `, kept in ${g.quarantine}` : ''}; ${g.file})`,
  );
  for (const c of report.clamped) lines.push(`  group ${c.group} ${c.topic}/${c.partition}: committed offset ${c.from} past the end, moved back to ${c.to}`);
  return lines.join('\n');
}

export function register(program: Command): void {
  const log = program.command('log').description('maintain an embedded event log directory');
  log
    .command('repair <dir>')
    .description('open a damaged embedded log (a run directory or its log/), quarantining damaged records, missing segments and journal entries; prints what was lost')
    .action(async (given: string) => {
      // A run directory stands for its log/: opened as a log itself, an empty one would be created inside the run.
      const dir = resolveEmbeddedLog(given, undefined, 'log repair').log;
      const report = await repairLog(dir, jsonLogger({ level: 'warn', fields: { role: 'log-repair' }, write: (l) => process.stderr.write(l + '\n') }));
      const found = report.foundNow.length;
      console.log(found === 0 && report.clamped.length === 0 ? `rlstream log repair: ${dir}: nothing to repair` : `rlstream log repair: ${dir}: ${found} damaged range(s) quarantined`);
      if (report.gaps.length > 0 || report.clamped.length > 0) console.log(`gaps and moved offsets, as listed in the partitions' damage.json:\n${summary(report)}`);
    });
  log
    .command('check <dir>')
    .description('check every record of an embedded log (a run directory or its log/) and report its damage, without writing to it; exit 1 when it has any or cannot be opened')
    .action(async (given: string) => {
      let report: DamageReport;
      let dir = given;
      try {
        dir = resolveEmbeddedLog(given, undefined, 'log check').log;
        report = await checkLog(dir, jsonLogger({ level: 'warn', fields: { role: 'log-check' }, write: (l) => process.stderr.write(l + '\n') }));
      } catch (err) {
        console.log(`rlstream log check: ${dir}: ${describeError(err)}`);
        process.exitCode = 1;
        return;
      }
      if (report.gaps.length === 0) {
        console.log(`rlstream log check: ${dir}: no damage listed`);
        return;
      }
      console.log(`rlstream log check: ${dir}: ${report.gaps.length} gap(s) of records lost to damage:\n${summary(report)}`);
      process.exitCode = 1;
    });
}
