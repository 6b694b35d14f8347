// CRC-32C (Castagnoli), which every Kafka record batch carries, computed eight bytes per step ("slicing by 8").
// kafkajs computes it one byte per step, and that loop is the producer's largest cost in a profile. installFastCrc32c() puts this version in kafkajs's place through Node's module cache; it must run
// before kafkajs is first loaded (core/log/kafka/index.ts imports this module first), and is a no-op after.
import { createRequire } from 'node:module';

const POLY = 0x82f63b78; // reflected Castagnoli polynomial

/** TABLES[k][b]: the CRC contribution of byte b followed by k zero bytes. */
const TABLES: Int32Array[] = (() => {
  const t = Array.from({ length: 8 }, () => new Int32Array(256));
  for (let b = 0; b < 256; b++) {
    let c = b;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLY : c >>> 1;
    t[0]![b] = c;
  }
  for (let b = 0; b < 256; b++) {
    let c = t[0]![b]!;
    for (let k = 1; k < 8; k++) {
      c = t[0]![c & 0xff]! ^ (c >>> 8);
      t[k]![b] = c;
    }
  }
  return t;
})();

/** CRC-32C of `buf`, as an unsigned 32-bit integer. */
export function crc32c(buf: Uint8Array): number {
  const [t0, t1, t2, t3, t4, t5, t6, t7] = TABLES as [Int32Array, Int32Array, Int32Array, Int32Array, Int32Array, Int32Array, Int32Array, Int32Array];
  let crc = -1;
  let i = 0;
  const n = buf.length;
  // Whole 8-byte words through a 32-bit view from the first 4-byte aligned byte (little-endian host assumed,
  // as on every platform Node supports); the unaligned head and the tail go a byte at a time.
  const head = Math.min(n, (4 - (buf.byteOffset % 4)) % 4);
  for (; i < head; i++) crc = t0[(crc ^ buf[i]!) & 0xff]! ^ (crc >>> 8);
  const words = Math.floor((n - i) / 8) * 2;
  if (words > 0) {
    const u32 = new Int32Array(buf.buffer, buf.byteOffset + i, words);
    for (let w = 0; w < words; w += 2) {
      const lo = u32[w]! ^ crc;
      const hi = u32[w + 1]!;
      crc =
        t7[lo & 0xff]! ^
        t6[(lo >>> 8) & 0xff]! ^
        t5[(lo >>> 16) & 0xff]! ^
        t4[lo >>> 24]! ^
        t3[hi & 0xff]! ^
        t2[(hi >>> 8) & 0xff]! ^
        t1[(hi >>> 16) & 0xff]! ^
        t0[hi >>> 24]!;
    }
    i += words * 4;
  }
  for (; i < n; i++) crc = t0[(crc ^ buf[i]!) & 0xff]! ^ (crc >>> 8);
  return (crc ^ -1) >>> 0;
}

let installed: boolean | null = null;

/** Replaces kafkajs's CRC-32C module; returns whether it took effect (false when kafkajs was loaded before). */
export function installFastCrc32c(): boolean {
  if (installed !== null) return installed;
  const require = createRequire(import.meta.url);
  const path = require.resolve('kafkajs/src/protocol/recordBatch/crc32C/index.js');
  const cache = require.cache;
  const batchModule = require.resolve('kafkajs/src/protocol/recordBatch/v0/index.js');
  if (cache[batchModule]) {
    installed = false; // kafkajs already holds its own function
    return installed;
  }
  // A module object whose exports is our function: kafkajs's `require('../crc32C')` then gets it.
  const Module = (require('node:module') as { Module: new (id: string) => NodeJS.Module }).Module;
  const m = new Module(path);
  m.filename = path;
  m.loaded = true;
  m.exports = crc32c;
  cache[path] = m;
  installed = true;
  return installed;
}

installFastCrc32c();
