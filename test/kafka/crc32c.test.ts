// Our CRC-32C (core/log/kafka/crc32c.ts) against kafkajs's own implementation and the standard check value,
// and its installation in kafkajs's place.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { randomBytes } from 'node:crypto';
import { crc32c, installFastCrc32c } from '../../core/log/kafka/crc32c.ts';

const require = createRequire(import.meta.url);

test('crc32c matches the check value and kafkajs on aligned and unaligned buffers of every small length', () => {
  assert.equal(crc32c(Buffer.from('123456789')), 0xe3069283);
  assert.equal(crc32c(Buffer.alloc(0)), 0);
  const reference = require('kafkajs/src/protocol/recordBatch/crc32C/crc32C.js') as (b: Buffer) => number;
  const pool = randomBytes(4096);
  for (let offset = 0; offset < 8; offset++) {
    for (let length = 0; length < 300; length += 1 + (length >> 4)) {
      const b = pool.subarray(offset, offset + length);
      assert.equal(crc32c(b), reference(b), `offset ${offset} length ${length}`);
    }
  }
  const big = randomBytes(1 << 20).subarray(3);
  assert.equal(crc32c(big), reference(big));
});

test('kafkajs uses it once the Kafka log module is loaded first', async () => {
  assert.equal(installFastCrc32c(), true);
  await import('../../core/log/kafka/index.ts');
  const used = require('kafkajs/src/protocol/recordBatch/crc32C/index.js') as unknown;
  assert.equal(used, crc32c);
});
