// A field renamed in the event contract (TurnCompleted.loss_mask → response_mask, schema v3) keeps every old
// record readable: the current schema names the old name as an Avro alias, the embedded registry's BACKWARD check
// accepts the new version over the old one, and a record written under the old name decodes with its value under
// the new one (and reaches the trace row the same). Without the alias the registry refuses the rename, so the
// alias, not a lenient check, is what carries old logs over. Records are generated (random values of every
// history version that had the old name) and hand-written (the stored v1 fixture bytes).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import avro from 'avsc';
import { EVENT_NAMES, historyVersions, resolvedSchema, type EventName } from '../../schemas/index.ts';
import { FIXTURE_DIR, historyType } from '../../schemas/snapshot.ts';
import { EventSerde, subjectOf } from '../../core/serde/events.ts';
import { EmbeddedRegistry, checkBackward } from '../../core/serde/embedded-registry.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { rowsOf } from '../../consumers/traces/rows.ts';
import { embeddedLog } from '../producers/helpers.ts';

interface Field {
  name: string;
  aliases?: string[];
}

/** Every top-level field of today's contract that carries aliases: (event, new name, old names). */
function renamed(): { event: EventName; name: string; aliases: string[] }[] {
  return EVENT_NAMES.flatMap((event) =>
    fieldsOf(resolvedSchema(event)).filter((f) => (f.aliases ?? []).length > 0).map((f) => ({ event, name: f.name, aliases: f.aliases! })),
  );
}

function fieldsOf(schema: unknown): Field[] {
  return (schema as { fields?: Field[] }).fields ?? [];
}

function framed(id: number, body: Buffer): Buffer {
  const header = Buffer.alloc(5);
  header.writeUInt32BE(id, 1);
  return Buffer.concat([header, body]);
}

test('the mask has one name in the contract: TurnCompleted.response_mask, with loss_mask as its alias', () => {
  assert.deepEqual(renamed(), [{ event: 'TurnCompleted', name: 'response_mask', aliases: ['loss_mask'] }]);
  // An alias is a name the field really had: some kept history version has a field of that name.
  for (const r of renamed()) {
    for (const alias of r.aliases) {
      const had = historyVersions(r.event).some((v) => fieldsOf(v.schema).some((f) => f.name === alias));
      assert.ok(had, `${r.event}.${r.name}: alias ${alias} is in no history version`);
    }
  }
});

test('records written under the old name decode with the value under the new one, through a real registry', async () => {
  const t = await embeddedLog(1);
  const registry = await EmbeddedRegistry.open(t.log);
  try {
    for (const r of renamed()) {
      const olds = historyVersions(r.event).filter((v) => fieldsOf(v.schema).some((f) => r.aliases.includes(f.name)));
      assert.ok(olds.length > 0);
      const ids = new Map<number, number>();
      for (const v of olds) ids.set(v.version, await registry.register(subjectOf(r.event), JSON.stringify(v.schema)));
      // Registering today's schema after the old ones passes the registry's BACKWARD check.
      const serde = await new EventSerde(registry).init();
      for (const v of olds) assert.notEqual(ids.get(v.version), serde.schemaId(r.event));
      const oldName = (v: (typeof olds)[number]) => fieldsOf(v.schema).find((f) => r.aliases.includes(f.name))!.name;
      const cases: { version: number; bytes: Buffer; old: unknown }[] = [];
      // Hand-written: the stored v1 fixture (written once under v1, the old name).
      const v1 = olds.find((v) => v.version === 1);
      if (v1) {
        const bytes = Buffer.from(readFileSync(join(FIXTURE_DIR, `${r.event}.avro.hex`), 'utf8').trim(), 'hex');
        cases.push({ version: 1, bytes, old: (historyType(r.event, 1).fromBuffer(bytes) as unknown as Record<string, unknown>)[oldName(v1)] });
      }
      // Generated: random values of every old version, empty and long arrays among them.
      for (const v of olds) {
        const type = historyType(r.event, v.version);
        for (let i = 0; i < 60; i++) {
          const value = type.random() as unknown as Record<string, unknown>;
          if (i === 0) value[oldName(v)] = [];
          if (i === 1) value[oldName(v)] = Array.from({ length: 5000 }, (_, k) => (k % 3 === 0 ? 0 : 1));
          cases.push({ version: v.version, bytes: type.toBuffer(value), old: value[oldName(v)] });
        }
      }
      for (const c of cases) {
        const d = await serde.decode(framed(ids.get(c.version)!, c.bytes));
        const value = d.value as unknown as Record<string, unknown>;
        assert.deepEqual(value[r.name], c.old, `${r.event} v${c.version}: ${r.name} is the old field's value`);
        for (const alias of r.aliases) assert.equal(alias in value, false, `${r.event} v${c.version}: no ${alias} key after decoding`);
        if (r.event === 'TurnCompleted') {
          // The trace row's column (which keeps the old name: see consumers/traces/rows.ts) gets the same mask.
          assert.deepEqual(rowsOf(d)[0]!.row['loss_mask'], c.old);
        }
        // Re-encoded under today's schema, it decodes to the same value (nothing was lost in the rename).
        const again = await serde.decode(serde.encode(r.event, value as never));
        assert.deepEqual((again.value as unknown as Record<string, unknown>)[r.name], c.old);
      }
    }
  } finally {
    await registry.close();
    await t.cleanup();
  }
});

test('without its alias the rename is refused by the registry check (the alias is what makes it BACKWARD)', () => {
  for (const r of renamed()) {
    const current = resolvedSchema(r.event) as unknown as { fields: Field[] };
    const stripped = { ...current, fields: current.fields.map((f) => (f.name === r.name ? { ...f, aliases: undefined } : f)) };
    for (const v of historyVersions(r.event)) {
      const hadOld = fieldsOf(v.schema).some((f) => r.aliases.includes(f.name));
      if (!hadOld) continue;
      assert.throws(
        () => checkBackward(subjectOf(r.event), JSON.stringify(stripped), JSON.stringify(v.schema)),
        (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE') && e.message.includes(subjectOf(r.event)),
        `${r.event} v${v.version}`,
      );
      checkBackward(subjectOf(r.event), JSON.stringify(current), JSON.stringify(v.schema));
    }
    // And avsc alone, without the registry: the stripped schema cannot resolve the old writer.
    assert.throws(() => avro.Type.forSchema(stripped as avro.Schema, { wrapUnions: false }).createResolver(historyType(r.event, 1)));
  }
});
