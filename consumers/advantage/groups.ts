// Group assembly for the advantage consumer: members of one prompt's group (same group_id, hence the same
// partition) are held until the group is complete, its timeout passes, or the open-group bound forces it out.
// The offsets of held records are what the processor runtime keeps its commit below.
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
  openedMs: number;
}

export type CloseReason = 'complete' | 'timeout' | 'evicted';

export class GroupTable {
  /** Insertion order = opening order, so the first entries are the oldest (timeouts, eviction). */
  private readonly open = new Map<string, OpenGroup>();
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

  /** Add a member; returns the group, and whether this trajectory was already in it (a duplicate). */
  add(member: Member, now: number): { group: OpenGroup; duplicate: boolean } {
    const traj = member.event.trajectory;
    let g = this.open.get(traj.group_id);
    if (!g) {
      g = { groupId: traj.group_id, topic: member.record.topic, partition: member.record.partition, expected: Math.max(1, traj.group_size), members: [], openedMs: now };
      this.open.set(traj.group_id, g);
    }
    if (g.members.some((m) => m.event.trajectory.trajectory_id === traj.trajectory_id)) return { group: g, duplicate: true };
    g.members.push(member);
    return { group: g, duplicate: false };
  }

  close(groupId: string): OpenGroup | undefined {
    const g = this.open.get(groupId);
    if (!g) return undefined;
    this.open.delete(groupId);
    this.closed.add(groupId);
    if (this.closed.size > this.closedCapacity) this.closed.delete(this.closed.values().next().value as string);
    return g;
  }

  /** Groups open for at least timeoutMs, oldest first. */
  expired(now: number, timeoutMs: number): OpenGroup[] {
    const out: OpenGroup[] = [];
    for (const g of this.open.values()) {
      if (now - g.openedMs < timeoutMs) break;
      out.push(g);
    }
    return out;
  }

  oldest(): OpenGroup | undefined {
    return this.open.values().next().value;
  }

  heldOffsets(topic: string, partition: number): number[] {
    const out: number[] = [];
    for (const g of this.open.values()) if (g.topic === topic && g.partition === partition) for (const m of g.members) out.push(m.record.offset);
    return out;
  }

  /** Forget a partition's open groups (revoked): its new owner re-reads them from the committed offset. */
  dropPartition(topic: string, partition: number): void {
    for (const [id, g] of this.open) if (g.topic === topic && g.partition === partition) this.open.delete(id);
  }
}
