// Replay ranges: `--from`/`--to` as an offset (every partition) or an ISO time (first record at or after it),
// resolved per partition against the log's offsets. `to` is exclusive; without it, the end is the log's end
// when the replay starts, so a replay of a live log terminates.
import { RlstreamError } from '../../core/errors.ts';
import type { EventLog } from '../../core/log/types.ts';

export type Position = { kind: 'earliest' } | { kind: 'offset'; offset: number } | { kind: 'time'; ms: number };

export function parsePosition(text: string | undefined, what: string): Position | undefined {
  if (text === undefined || text === '') return undefined;
  if (text === 'earliest' || text === 'beginning') return { kind: 'earliest' };
  if (/^\d+$/.test(text)) return { kind: 'offset', offset: Number(text) };
  // An ISO date or date-time; a bare number was an offset above.
  if (/^\d{4}-\d{2}-\d{2}/.test(text)) {
    const ms = Date.parse(text);
    if (Number.isFinite(ms)) return { kind: 'time', ms };
  }
  throw new RlstreamError('INPUT_INVALID', `${what} must be an offset, an ISO time or 'earliest', got ${JSON.stringify(text)}`);
}

export interface PartitionRange {
  topic: string;
  partition: number;
  /** First offset to read. */
  start: number;
  /** First offset not to read. */
  end: number;
}

async function resolveOne(log: EventLog, topic: string, pos: Position | undefined, fallback: 'low' | 'high'): Promise<Map<number, number>> {
  const offsets = await log.offsets(topic);
  const out = new Map<number, number>();
  if (pos?.kind === 'time') {
    for (const o of await log.offsetsForTimestamp(topic, pos.ms)) out.set(o.partition, o.offset);
    return out;
  }
  for (const p of offsets) {
    if (pos?.kind === 'offset') out.set(p.partition, Math.min(Math.max(pos.offset, p.low), p.high));
    else if (pos?.kind === 'earliest') out.set(p.partition, p.low);
    else out.set(p.partition, fallback === 'low' ? p.low : p.high);
  }
  return out;
}

/** The per-partition ranges of a replay over existing topics (missing topics are skipped). */
export async function resolveRanges(log: EventLog, topics: readonly string[], from?: Position, to?: Position): Promise<PartitionRange[]> {
  const existing = new Set((await log.listTopics()).map((t) => t.name));
  const ranges: PartitionRange[] = [];
  for (const topic of topics) {
    if (!existing.has(topic)) continue;
    const starts = await resolveOne(log, topic, from, 'low');
    const ends = await resolveOne(log, topic, to, 'high');
    for (const [partition, start] of starts) {
      const end = ends.get(partition) ?? start;
      ranges.push({ topic, partition, start, end: Math.max(start, end) });
    }
  }
  return ranges;
}
