// Kafka's default partitioner, so a keyed record lands on the same partition in the embedded log and in Kafka
// (and a log exported from one to the other keeps every key's order): murmur2 of the key bytes, made positive
// by masking the sign bit (not Math.abs, which Kafka avoided because abs(MIN_VALUE) is negative), mod the
// partition count. Records without a key go round-robin.

const SEED = 0x9747b28c;
const M = 0x5bd1e995;

/** Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) as a signed 32-bit integer. */
export function murmur2(data: Buffer): number {
  const length = data.length;
  let h = (SEED ^ length) | 0;
  const whole = length & ~3;
  for (let i = 0; i < whole; i += 4) {
    let k = (data[i]! | (data[i + 1]! << 8) | (data[i + 2]! << 16) | (data[i + 3]! << 24)) | 0;
    k = Math.imul(k, M);
    k ^= k >>> 24;
    k = Math.imul(k, M);
    h = Math.imul(h, M) ^ k;
  }
  // Java's switch falls through from the highest remaining byte down; the multiply happens once at the end.
  const rest = length & 3;
  if (rest === 3) h ^= data[whole + 2]! << 16;
  if (rest >= 2) h ^= data[whole + 1]! << 8;
  if (rest >= 1) {
    h ^= data[whole]!;
    h = Math.imul(h, M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, M);
  h ^= h >>> 15;
  return h | 0;
}

function toPositive(n: number): number {
  return n & 0x7fffffff;
}

function keyBytes(key: Buffer | string): Buffer {
  return typeof key === 'string' ? Buffer.from(key, 'utf8') : key;
}

/** The partition Kafka's default partitioner picks for a key. */
export function partitionForKey(key: Buffer | string, partitions: number): number {
  return toPositive(murmur2(keyBytes(key))) % partitions;
}

/** Picks partitions for records: explicit partition, else the key's partition, else round-robin. */
export class Partitioner {
  private next = 0;

  partition(record: { key?: Buffer | string | null; partition?: number }, partitions: number): number {
    if (record.partition !== undefined) return record.partition;
    if (record.key !== undefined && record.key !== null) return partitionForKey(record.key, partitions);
    const p = this.next % partitions;
    this.next = (this.next + 1) % 0x7fffffff;
    return p;
  }
}
