// A damage report of the embedded log as `rlstream log check` and `rlstream log repair` print it, and what makes
// a check fail: every range lost and not yet repaired, every file not the log's own, committed offsets past the
// end, a stale LOCK, a manifest missing or damaged. Ranges a repair (or an open) already listed are shown as
// accepted and fail nothing: a repaired log checks clean.
import type { DamageRecord, DamageReport } from './index.ts';

function rangeLine(g: DamageRecord): string {
  const span = g.toOffset === null ? `offsets ${g.fromOffset}..end` : `offsets ${g.fromOffset}..${g.toOffset - 1} (${g.toOffset - g.fromOffset} record${g.toOffset - g.fromOffset === 1 ? '' : 's'})`;
  return `  ${g.topic}/${g.partition} ${span}: ${g.reason} (${g.bytes} bytes${g.quarantine ? `, kept in ${g.quarantine}` : ''}; ${g.file})`;
}

/** "N records" over ranges, or "at least N" when a range runs to an unknown end. */
function recordCount(gaps: DamageRecord[]): string {
  const n = gaps.reduce((a, g) => a + (g.toOffset === null ? 1 : g.toOffset - g.fromOffset), 0);
  return `${gaps.some((g) => g.toOffset === null) ? 'at least ' : ''}${n} record${n === 1 ? '' : 's'}`;
}

function manifestNote(report: DamageReport): string | null {
  switch (report.manifest) {
    case 'predates':
      return 'manifest: none, this log was written by an older rlstream: only frame checks and gaps between segments find its losses (whole segments, partitions or topics deleted, or a segment cut at a record boundary, go unseen); its next read-write open records what it holds from then on';
    case 'missing':
      return 'manifest: manifest.json is MISSING although the topics were written with one: what the log should hold cannot be compared; `rlstream log repair` writes it anew from the files';
    case 'damaged':
      return 'manifest: manifest.json is DAMAGED: what the log should hold cannot be compared; `rlstream log repair` sets it aside and writes it anew from the files';
    default:
      return report.closedCleanly === false ? 'manifest: the last writer did not close the log (it crashed, or runs now): records written after its last roll, checkpoint or open are not listed, so a loss among them shows only in a frame check' : null;
  }
}

/** The lines of a report; `problems` counts what makes `check` exit 1. */
export function describeDamage(report: DamageReport, mode: 'check' | 'repair'): { lines: string[]; problems: number } {
  const lines: string[] = [];
  let problems = 0;
  const found = new Set(report.foundNow);
  const now = report.foundNow;
  const accepted = report.gaps.filter((g) => !found.has(g));
  if (now.length > 0) {
    problems += now.length;
    lines.push(
      mode === 'check'
        ? `${now.length} range(s) of records lost and not repaired (${recordCount(now)}):`
        : `${now.length} range(s) of records lost (${recordCount(now)}), now listed in the partitions' damage.json and skipped by readers:`,
    );
    lines.push(...now.map(rangeLine));
  }
  if (report.extra.length > 0) {
    if (mode === 'check') problems += report.extra.length;
    lines.push(`${report.extra.length} file(s) that are not the log's own:`);
    lines.push(...report.extra.map((x) => `  ${x.file}: ${x.reason}${x.quarantine ? ` (moved to ${x.quarantine})` : ''}`));
  }
  if (report.clamped.length > 0) {
    if (mode === 'check') problems += report.clamped.length;
    lines.push(`${report.clamped.length} committed offset(s) past the end of their partition (records lost at its end), ${mode === 'check' ? 'to be moved back' : 'moved back'}:`);
    lines.push(...report.clamped.map((c) => `  group ${c.group} ${c.topic}/${c.partition}: committed ${c.from}, the partition ends at ${c.to} (offsets ${c.to}..${c.from - 1} lost)`));
  }
  if (report.lock) {
    const l = report.lock;
    if (mode === 'repair') lines.push(`stale LOCK taken over: ${l.why}`);
    else if (l.state === 'stale') {
      problems++;
      lines.push(`stale LOCK: ${l.file}: ${l.why}. \`rlstream log repair\` takes it over; or delete it once no rlstream process uses the log`);
    } else lines.push(`LOCK: ${l.why}`);
  }
  const note = manifestNote(report);
  if (note) {
    if (mode === 'check' && (report.manifest === 'missing' || report.manifest === 'damaged')) problems++;
    lines.push(note);
  }
  if (accepted.length > 0) {
    lines.push(`${accepted.length} range(s) lost earlier and accepted (listed in damage.json by a repair or by an open that quarantined them; readers skip them):`);
    lines.push(...accepted.map(rangeLine));
  }
  return { lines, problems };
}

