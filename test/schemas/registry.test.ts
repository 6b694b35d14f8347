// The embedded schema registry (schemas stored in the log's `_schemas` topic) and the serde's typed errors on
// bad input: unknown ids, truncated or corrupt bytes, values that do not match their schema.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde, subjectOf } from '../../core/serde/events.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { TOPICS } from '../../core/topics.ts';
import { EVENT_NAMES, schemaText } from '../../schemas/index.ts';
import { fixtureValue } from '../../schemas/snapshot.ts';
import type { EventTypes } from '../../schemas/generated/types.ts';

async function withRegistryDir(body: (dir: string) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-registry-'));
  try {
    await body(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('ids are stable: same text same id, order of first registration, kept across reopen', async () => {
  await withRegistryDir(async (dir) => {
    let log = openEmbeddedLog({ dir });
    let reg = await EmbeddedRegistry.open(log);
    const serde = await new EventSerde(reg).init();
    const ids = EVENT_NAMES.map((n) => serde.schemaId(n));
    assert.deepEqual(ids, EVENT_NAMES.map((_, i) => i + 1));
    assert.equal(await reg.register(subjectOf('Control'), schemaText('Control')), ids[EVENT_NAMES.indexOf('Control')]);
    assert.equal((await log.offsets(TOPICS.schemas))[0]?.high, EVENT_NAMES.length, 'one _schemas record per registration');
    await reg.close();
    await log.close();

    log = openEmbeddedLog({ dir });
    reg = await EmbeddedRegistry.open(log);
    const again = await new EventSerde(reg).init();
    assert.deepEqual(EVENT_NAMES.map((n) => again.schemaId(n)), ids);
    assert.equal(await reg.getById(ids[0]!), schemaText(EVENT_NAMES[0]));
    assert.deepEqual(await reg.versions(subjectOf('Control')), [ids[EVENT_NAMES.indexOf('Control')]]);
    assert.equal((await log.offsets(TOPICS.schemas))[0]?.high, EVENT_NAMES.length, 'reopening registers nothing new');
    await reg.close();
    await log.close();
  });
});

test('a compatible new version gets the next id; an incompatible one is refused naming the subject', async () => {
  await withRegistryDir(async (dir) => {
    const log = openEmbeddedLog({ dir });
    const reg = await EmbeddedRegistry.open(log);
    const subject = 'rlstream.test.Thing';
    const v1 = { type: 'record', name: 'Thing', namespace: 'rlstream.test', fields: [{ name: 'a', type: 'string' }] };
    const v2 = { ...v1, fields: [...v1.fields, { name: 'b', type: 'int', default: 0 }] };
    const bad = { ...v2, fields: [...v2.fields, { name: 'c', type: 'string' }] };
    const id1 = await reg.register(subject, JSON.stringify(v1));
    const id2 = await reg.register(subject, JSON.stringify(v2));
    assert.equal(id2, id1 + 1);
    await assert.rejects(reg.register(subject, JSON.stringify(bad)), (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE') && e.message.includes(subject));
    assert.deepEqual(await reg.versions(subject), [id1, id2]);
    await assert.rejects(reg.register(subject, '{"type":'), (e) => isRlstreamError(e, 'INPUT_INVALID'));
    await reg.close();
    await log.close();
  });
});

test('EventSerde turns bad input into typed errors, never a crash', async () => {
  await withRegistryDir(async (dir) => {
    const log = openEmbeddedLog({ dir });
    const reg = await EmbeddedRegistry.open(log);
    const serde = await new EventSerde(reg).init();
    const good = serde.encode('Control', fixtureValue('Control') as EventTypes['Control']);
    assert.equal((await serde.decode(good)).name, 'Control');

    const unknown = Buffer.from(good);
    unknown.writeUInt32BE(9999, 1);
    await assert.rejects(serde.decode(unknown), (e) => isRlstreamError(e, 'SERDE_UNKNOWN_SCHEMA'));
    await assert.rejects(serde.decode(good.subarray(0, 3)), (e) => isRlstreamError(e, 'SERDE_TRUNCATED'));
    await assert.rejects(serde.decode(good.subarray(0, good.length - 4)), (e) => isRlstreamError(e, 'SERDE_TRUNCATED') || isRlstreamError(e, 'SERDE_DECODE'));
    const magic = Buffer.from(good);
    magic[0] = 7;
    await assert.rejects(serde.decode(magic), (e) => isRlstreamError(e, 'SERDE_MAGIC_BYTE'));
    // Corrupt body: the enum index (after three strings and a long) set far out of range.
    const corrupt = Buffer.concat([good.subarray(0, 5), Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f]), good.subarray(10)]);
    await assert.rejects(serde.decode(corrupt), (e) => isRlstreamError(e, 'SERDE_DECODE') || isRlstreamError(e, 'SERDE_TRUNCATED'));
    assert.throws(
      () => serde.encode('Control', { ...(fixtureValue('Control') as EventTypes['Control']), command: 'explode' as 'stop' }),
      (e) => isRlstreamError(e, 'SERDE_SCHEMA_MISMATCH') && e.message.includes('command'),
    );
    await reg.close();
    await log.close();
  });
});
