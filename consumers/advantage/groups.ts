// Group assembly for the advantage consumer: members of one prompt's group (same group_id, hence the same
// partition) are held until the group is complete, its timeout passes, or the open-group bound forces it out.
// The offsets of held records are what the processor runtime keeps its commit below.
//
// A group's age is measured in the log's time, not the consumer's: it opens at its first member's record
// timestamp, and a partition's clock is the newest record timestamp read from it. A consumer that is behind its
// input (restarted, slow, replaying) therefore closes the same groups a live one did, never a group whose members
// are still unread in the partition. Wall-clock time only closes a group once its partition has nothing left to
// read (AdvantageHandler.tick asks the processor), and then counts from when this consumer read the group's first
// member, never from the record timestamp: that was stamped by the writer's clock, and a writer whose clock runs
// behind this machine's by more than the timeout would otherwise have its groups closed on their first member.
import type { LogRecord } from '../../core/log/types.ts';
import type { RewardedTrajectory } from '../../schemas/generated/types.ts';

export interface Member {
  record: LogRecord;
  event: RewardedTrajectory;
}

export interface OpenGroup {
  groupId: string;
  topic: string;
  partition: number;
  expected: number;
  members: Member[];
  /** Record timestamp of its first member (ms since the epoch, the log's time). */
  openedMs: number;
  /** This consumer's wall clock when it read the first member (ms since the epoch, this machine's time). */
  seenMs: number;
}

/** Which clock ages a group: the partition's (record timestamps) or this consumer's wall clock. */
export type GroupClock = 'log' | 'wall';
const ageFrom = (g: OpenGroup, clock: GroupClock) => (clock === 'log' ? g.openedMs : g.seenMs);

export type CloseReason = 'complete' | 'timeout' | 'evicted';

const tpKey = (topic: string, partition: number) => `${topic}:${partition}`;

export class GroupTable {
  /** Insertion order = opening order, so the first entries are the oldest read (eviction). */
  private readonly open = new Map<string, OpenGroup>();
  /** The same groups per partition, in the partition's order (timeouts are per partition). */
  private readonly byPartition = new Map<string, Map<string, OpenGroup>>();
  /** Per partition, the newest record timestamp read: the partition's clock. */
  private readonly clock = new Map<string, number>();
  /** Recently closed ids: a member arriving after its group closed is late, never a new group. */
  private readonly closed = new Set<string>();

  constructor(private readonly closedCapacity = 100_000) {}

  get size(): number {
    return this.open.size;
  }

  get(groupId: string): OpenGroup | undefined {
    return this.open.get(groupId);
  }

  isClosed(groupId: string): boolean {
    return this.closed.has(groupId);
  }

  /** A record was read from its partition: its timestamp moves the partition's clock (never back). */
  observe(record: LogRecord): number {
    const key = tpKey(record.topic, record.partition);
    const t = Math.max(this.clock.get(key) ?? -Infinity, record.timestamp);
    this.clock.set(key, t);
    return t;
  }

  /**
   * Add a member read at `seenMs` (this consumer's wall clock); returns the group, and whether this trajectory was
   * already in it (a duplicate).
   */
  add(member: Member, seenMs: number): { group: OpenGroup; duplicate: boolean } {
    const traj = member.event.trajectory;
    let g = this.open.get(traj.group_id);
    if (!g) {
      const { topic, partition, timestamp } = member.record;
      g = { groupId: traj.group_id, topic, partition, expected: Math.max(1, traj.group_size), members: [], openedMs: timestamp, seenMs };
      this.open.set(traj.group_id, g);
      const key = tpKey(topic, partition);
      let part = this.byPartition.get(key);
      if (!part) this.byPartition.set(key, (part = new Map()));
      part.set(traj.group_id, g);
    }
    if (g.members.some((m) => m.event.trajectory.trajectory_id === traj.trajectory_id)) return { group: g, duplicate: true };
    g.members.push(member);
    return { group: g, duplicate: false };
  }

  close(groupId: string): OpenGroup | undefined {
    const g = this.open.get(groupId);
    if (!g) return undefined;
    this.open.delete(groupId);
    this.byPartition.get(tpKey(g.topic, g.partition))?.delete(groupId);
    this.closed.add(groupId);
    if (this.closed.size > this.closedCapacity) this.closed.delete(this.closed.values().next().value as string);
    return g;
  }

  /**
   * A partition's groups at least timeoutMs old at `at` on `clock` (the partition's clock against record
   * timestamps, or the wall clock against when this consumer read them), in the partition's order. Timestamps
   * within a partition are nearly monotonic (one producer clock per writer), and read times are monotonic: the
   * scan stops at the first younger group, so a group behind an out-of-order younger one closes a little later,
   * never earlier.
   */
  expired(topic: string, partition: number, at: number, timeoutMs: number, clock: GroupClock): OpenGroup[] {
    const out: OpenGroup[] = [];
    for (const g of this.byPartition.get(tpKey(topic, partition))?.values() ?? []) {
      if (at - ageFrom(g, clock) < timeoutMs) break;
      out.push(g);
    }
    return out;
  }

  /** Partitions holding a group this consumer read at least timeoutMs before `now` (its wall clock). */
  partitionsOlderThan(now: number, timeoutMs: number): { topic: string; partition: number }[] {
    const out: { topic: string; partition: number }[] = [];
    for (const part of this.byPartition.values()) {
      const first = part.values().next().value;
      if (first && now - first.seenMs >= timeoutMs) out.push({ topic: first.topic, partition: first.partition });
    }
    return out;
  }

  oldest(): OpenGroup | undefined {
    return this.open.values().next().value;
  }

  heldOffsets(topic: string, partition: number): number[] {
    const out: number[] = [];
    for (const g of this.byPartition.get(tpKey(topic, partition))?.values() ?? []) for (const m of g.members) out.push(m.record.offset);
    return out;
  }

  /** Forget a partition's open groups and clock (revoked): its new owner re-reads them from the committed offset. */
  dropPartition(topic: string, partition: number): void {
    const key = tpKey(topic, partition);
    for (const id of this.byPartition.get(key)?.keys() ?? []) this.open.delete(id);
    this.byPartition.delete(key);
    this.clock.delete(key);
  }
}
