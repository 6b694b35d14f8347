// Consumer groups of the embedded log: which member holds which partition, and the committed offsets.
// Assignment is recomputed whenever a member joins or leaves (members see it at once: one process, no
// protocol); each subscribed topic's partitions go round-robin over its members in join order.
import type { OffsetTriple } from './journal.ts';

export interface TopicPartition {
  topic: string;
  partition: number;
}

export interface GroupMember {
  readonly memberId: number;
  readonly topics: readonly string[];
  /** The member's new assignment, delivered synchronously. */
  assign(partitions: TopicPartition[]): void;
}

export function tpKey(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}

export class GroupCoordinator {
  private readonly members = new Map<string, Map<number, GroupMember>>();
  private readonly offsets = new Map<string, Map<string, OffsetTriple>>();

  constructor(private readonly partitionsOf: (topic: string) => number) {}

  join(groupId: string, member: GroupMember): void {
    const m = this.members.get(groupId) ?? new Map<number, GroupMember>();
    m.set(member.memberId, member);
    this.members.set(groupId, m);
    this.rebalance(groupId);
  }

  leave(groupId: string, member: GroupMember): void {
    const m = this.members.get(groupId);
    if (!m?.delete(member.memberId)) return;
    if (m.size === 0) this.members.delete(groupId);
    else this.rebalance(groupId);
  }

  private rebalance(groupId: string): void {
    const members = [...(this.members.get(groupId)?.values() ?? [])].sort((a, b) => a.memberId - b.memberId);
    const out = new Map<number, TopicPartition[]>(members.map((m) => [m.memberId, []]));
    const topics = [...new Set(members.flatMap((m) => m.topics))].sort();
    for (const topic of topics) {
      const subs = members.filter((m) => m.topics.includes(topic));
      const n = this.partitionsOf(topic);
      for (let p = 0; p < n; p++) out.get(subs[p % subs.length]!.memberId)!.push({ topic, partition: p });
    }
    for (const m of members) m.assign(out.get(m.memberId)!);
  }

  committedOffset(groupId: string, topic: string, partition: number): number | undefined {
    return this.offsets.get(groupId)?.get(tpKey(topic, partition))?.[2];
  }

  committed(groupId: string, topic: string): OffsetTriple[] {
    return [...(this.offsets.get(groupId)?.values() ?? [])].filter((t) => t[0] === topic).sort((a, b) => a[1] - b[1]);
  }

  setOffsets(groupId: string, triples: OffsetTriple[]): void {
    const m = this.offsets.get(groupId) ?? new Map<string, OffsetTriple>();
    for (const t of triples) m.set(tpKey(t[0], t[1]), [t[0], t[1], t[2]]);
    this.offsets.set(groupId, m);
  }

  snapshot(): Record<string, OffsetTriple[]> {
    return Object.fromEntries([...this.offsets].map(([g, m]) => [g, [...m.values()]]));
  }
}
