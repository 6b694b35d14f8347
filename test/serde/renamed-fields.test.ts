// A field renamed in the event contract keeps every old record readable: TurnCompleted.loss_mask → response_mask
// (v3), GroupStats.group_size → group_members (AdvantagedTrajectory v3, a field of a nested record) and
// PolicyVersion.version → policy_version (v2). The current schema names the old name as an Avro alias, the embedded
// registry's BACKWARD check accepts the new version over the old ones, and a record written under the old name
// decodes with its value under the new one (and reaches the trace row the same). Without the alias the registry
// refuses the rename, so the alias, not a lenient check, is what carries old logs over. Records are generated
// (random values of every history version that had the old name, edge values among them) and hand-written (the
// stored v1 fixture bytes, and the legacy v1 fixtures where there are some).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import avro from 'avsc';
import { historyVersions, resolvedSchema, type EventName } from '../../schemas/index.ts';
import { FIXTURE_DIR, historyType } from '../../schemas/snapshot.ts';
import { EventSerde, subjectOf } from '../../core/serde/events.ts';
import { EmbeddedRegistry, checkBackward } from '../../core/serde/embedded-registry.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { rowsOf } from '../../consumers/traces/rows.ts';
import { embeddedLog } from '../producers/helpers.ts';
import { fieldsOf, key, oldNameIn, recordAt, renamed, stripped, valueAt } from './renamed.ts';

function framed(id: number, body: Buffer): Buffer {
  const header = Buffer.alloc(5);
  header.writeUInt32BE(id, 1);
  return Buffer.concat([header, body]);
}

/** Edge values for a field of this type in generated records: empty and long arrays, the ints' and longs' ends. */
function edges(type: unknown): unknown[] {
  const t = typeof type === 'object' && type !== null ? (type as { type?: unknown; items?: unknown }) : { type };
  if (t.type === 'array' && t.items === 'int') return [[], Array.from({ length: 5000 }, (_, k) => (k % 3 === 0 ? 0 : 1))];
  if (t.type === 'int') return [0, -1, 2 ** 31 - 1, -(2 ** 31)];
  // avsc's longs are JS numbers: it encodes up to 2^53 - 2, and down to -2^52 (below, its zigzag loses the sign).
  if (t.type === 'long') return [0, -1, 2 ** 53 - 2, -(2 ** 52)];
  throw new Error(`no edge values for a renamed field of type ${JSON.stringify(type)}: add them here`);
}

/** The trace row's column that stores each renamed field: the columns keep their first names (see rows.ts). */
const TRACE_COLUMN: Record<string, string> = {
  'TurnCompleted.response_mask': 'loss_mask',
  'AdvantagedTrajectory.group.group_members': 'group_members',
  'PolicyVersion.policy_version': 'version',
};

test('each concept has one name in the contract: the renamed fields and their aliases', () => {
  assert.deepEqual(
    renamed().sort((a, b) => key(a).localeCompare(key(b))),
    [
      { event: 'AdvantagedTrajectory', parent: ['group'], name: 'group_members', aliases: ['group_size'] },
      { event: 'PolicyVersion', parent: [], name: 'policy_version', aliases: ['version'] },
      { event: 'TurnCompleted', parent: [], name: 'response_mask', aliases: ['loss_mask'] },
    ],
  );
  // An alias is a name the field really had: some kept history version has a field of that name at that place.
  for (const r of renamed()) {
    for (const alias of r.aliases) {
      const had = historyVersions(r.event).some((v) => fieldsOf(recordAt(v.schema, r.parent)).some((f) => f.name === alias));
      assert.ok(had, `${key(r)}: alias ${alias} is in no history version`);
    }
    assert.ok(TRACE_COLUMN[key(r)], `${key(r)}: name its trace column in TRACE_COLUMN`);
  }
  // GroupStats' old name is the Trajectory's group_size, which keeps meaning the size the producer intended.
  const trajectory = recordAt(resolvedSchema('AdvantagedTrajectory'), ['trajectory']);
  assert.ok(fieldsOf(trajectory).some((f) => f.name === 'group_size'));
});

test('records written under the old name decode with the value under the new one, through a real registry', async () => {
  const t = await embeddedLog(1);
  const registry = await EmbeddedRegistry.open(t.log);
  try {
    // Every old version first (a subject takes no older schema once today's is registered), in order.
    const idsOf = new Map<EventName, Map<number, number>>();
    for (const event of new Set(renamed().map((r) => r.event))) {
      const ids = new Map<number, number>();
      for (const v of historyVersions(event).slice(0, -1)) ids.set(v.version, await registry.register(subjectOf(event), JSON.stringify(v.schema)));
      idsOf.set(event, ids);
    }
    // Registering today's schemas after the old ones passes the registry's BACKWARD check.
    const serde = await new EventSerde(registry).init();
    const checked = new Map<string, number>();
    for (const r of renamed()) {
      const olds = historyVersions(r.event).filter((v) => oldNameIn(v.schema, r) !== undefined);
      assert.ok(olds.length > 0);
      const ids = idsOf.get(r.event)!;
      for (const v of olds) assert.notEqual(ids.get(v.version), serde.schemaId(r.event));
      const cases: { version: number; bytes: Buffer; old: unknown }[] = [];
      // Hand-written: the stored v1 fixture and the legacy v1 fixtures (written once under v1, the old name).
      const v1 = olds.find((v) => v.version === 1);
      if (v1) {
        const files = [join(FIXTURE_DIR, `${r.event}.avro.hex`), join(FIXTURE_DIR, 'legacy', `${r.event}.v1-truncated-masked.avro.hex`)].filter((p) => existsSync(p));
        for (const file of files) {
          const bytes = Buffer.from(readFileSync(file, 'utf8').trim(), 'hex');
          cases.push({ version: 1, bytes, old: valueAt(historyType(r.event, 1).fromBuffer(bytes), r.parent)[oldNameIn(v1.schema, r)!] });
        }
      }
      // Generated: random values of every old version, the field's edge values among them.
      for (const v of olds) {
        const type = historyType(r.event, v.version);
        const oldName = oldNameIn(v.schema, r)!;
        const special = edges(fieldsOf(recordAt(v.schema, r.parent)).find((f) => f.name === oldName)!.type);
        for (let i = 0; i < 60; i++) {
          const value = type.random() as unknown;
          if (i < special.length) valueAt(value, r.parent)[oldName] = special[i];
          cases.push({ version: v.version, bytes: type.toBuffer(value), old: valueAt(value, r.parent)[oldName] });
        }
      }
      for (const c of cases) {
        const d = await serde.decode(framed(ids.get(c.version)!, c.bytes));
        const at = valueAt(d.value, r.parent);
        assert.deepEqual(at[r.name], c.old, `${key(r)} v${c.version}: ${r.name} is the old field's value`);
        for (const alias of r.aliases) assert.equal(alias in at, false, `${key(r)} v${c.version}: no ${alias} key after decoding`);
        // The trace row's column (which keeps its first name: see consumers/traces/rows.ts) gets the same value.
        const rows = rowsOf(d);
        assert.equal(rows.length, 1, `${key(r)}: one trace row`);
        assert.deepEqual(rows[0]!.row[TRACE_COLUMN[key(r)]!], c.old, `${key(r)} v${c.version}: trace column ${TRACE_COLUMN[key(r)]}`);
        // Re-encoded under today's schema, it decodes to the same value (nothing was lost in the rename).
        const again = await serde.decode(serde.encode(r.event, d.value as never));
        assert.deepEqual(valueAt(again.value, r.parent)[r.name], c.old);
      }
      checked.set(key(r), cases.length);
    }
    // Every renamed field had records of every old version decoded, the stored fixtures among them.
    for (const r of renamed()) assert.ok((checked.get(key(r)) ?? 0) > 60, `${key(r)}: ${checked.get(key(r))} cases`);
  } finally {
    await registry.close();
    await t.cleanup();
  }
});

test('without its alias a rename is refused by the registry check (the alias is what makes it BACKWARD)', () => {
  for (const r of renamed()) {
    const current = resolvedSchema(r.event);
    const without = stripped(r);
    assert.equal(oldNameIn(without, { ...r, aliases: [r.name] }), r.name);
    assert.equal(fieldsOf(recordAt(without, r.parent)).find((f) => f.name === r.name)!.aliases, undefined);
    let refused = 0;
    for (const v of historyVersions(r.event)) {
      if (oldNameIn(v.schema, r) === undefined) continue;
      assert.throws(
        () => checkBackward(subjectOf(r.event), JSON.stringify(without), JSON.stringify(v.schema)),
        (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE') && e.message.includes(subjectOf(r.event)),
        `${key(r)} v${v.version}`,
      );
      checkBackward(subjectOf(r.event), JSON.stringify(current), JSON.stringify(v.schema));
      refused++;
    }
    assert.ok(refused > 0, `${key(r)}: no history version with the old name`);
    // And avsc alone, without the registry: the stripped schema cannot resolve the old writer.
    assert.throws(() => avro.Type.forSchema(without as avro.Schema, { wrapUnions: false }).createResolver(historyType(r.event, 1)));
  }
});
