// The event contract's evolution rules: every current schema reads every kept version's data (BACKWARD), the
// history is current, fixtures encode to their stored bytes, the compatibility check can fail, and the
// generated TypeScript types are fresh.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import avro from 'avsc';
import { EVENT_NAMES, eventType, historyVersions, resolvedSchema } from '../../schemas/index.ts';
import { FIXTURE_DIR, fixtureValue, historyType } from '../../schemas/snapshot.ts';
import { checkBackward } from '../../core/serde/embedded-registry.ts';
import { isRlstreamError } from '../../core/errors.ts';

const ROOT = join(import.meta.dirname, '..', '..');

function fixtureBytes(name: string): Buffer {
  return Buffer.from(readFileSync(join(FIXTURE_DIR, `${name}.avro.hex`), 'utf8').trim(), 'hex');
}

/** Deep equality where numbers may differ by float32 rounding (Avro `float` fields). */
function close(a: unknown, b: unknown, path = '$'): void {
  if (typeof a === 'number' && typeof b === 'number') {
    assert.ok(Math.abs(a - b) <= 1e-6 * Math.max(1, Math.abs(b)), `${path}: ${a} != ${b}`);
  } else if (Buffer.isBuffer(a) || Buffer.isBuffer(b)) {
    assert.ok(Buffer.isBuffer(a) && Buffer.isBuffer(b) && a.equals(b), `${path}: bytes differ`);
  } else if (Array.isArray(a) && Array.isArray(b)) {
    assert.equal(a.length, b.length, `${path}: length`);
    a.forEach((x, i) => close(x, b[i], `${path}[${i}]`));
  } else if (a !== null && b !== null && typeof a === 'object' && typeof b === 'object') {
    assert.deepEqual(Object.keys(a).sort(), Object.keys(b).sort(), `${path}: keys`);
    for (const k of Object.keys(a)) close((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], `${path}.${k}`);
  } else assert.equal(a, b, path);
}

for (const name of EVENT_NAMES) {
  test(`${name}: the current schema reads every historical version (BACKWARD)`, () => {
    const versions = historyVersions(name);
    assert.ok(versions.length >= 1, `no history for ${name}: run npx tsx schemas/snapshot.ts`);
    const current = eventType(name);
    for (const v of versions) {
      const old = avro.Type.forSchema(v.schema as avro.Schema, { wrapUnions: false });
      const resolver = current.createResolver(old);
      // v1's fixture bytes were written under v1; they must decode under today's schema.
      if (v.version === 1) {
        const decoded = current.fromBuffer(fixtureBytes(name), resolver);
        assert.ok(current.isValid(decoded), `${name} v1 fixture does not decode into a valid current value`);
      }
    }
  });

  test(`${name}: the latest history version is the current schema`, () => {
    const versions = historyVersions(name);
    const latest = versions[versions.length - 1];
    assert.ok(latest, `no history for ${name}`);
    assert.equal(JSON.stringify(latest.schema), JSON.stringify(resolvedSchema(name)), `${name} changed without a history snapshot: run npx tsx schemas/snapshot.ts`);
  });

  test(`${name}: the fixture encodes to its stored bytes and decodes back`, () => {
    const v1 = historyType(name, 1);
    const value = fixtureValue(name);
    assert.ok(v1.isValid(value), `${name}.json does not match v1`);
    const bytes = fixtureBytes(name);
    assert.equal(v1.toBuffer(value).toString('hex'), bytes.toString('hex'));
    const decoded = v1.fromBuffer(bytes);
    close(decoded, value);
    assert.ok(v1.toBuffer(decoded).equals(bytes));
  });
}

test('the compatibility check rejects a new field without a default', () => {
  const current = resolvedSchema('Control') as { fields: unknown[] };
  const broken = { ...current, fields: [...current.fields, { name: 'priority', type: 'int' }] };
  assert.throws(
    () => checkBackward('rlstream.events.Control', JSON.stringify(broken), JSON.stringify(current)),
    (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE') && e.message.includes('rlstream.events.Control'),
  );
  // The same field with a default is a compatible change, so the check is not simply always failing.
  const fine = { ...current, fields: [...current.fields, { name: 'priority', type: 'int', default: 0 }] };
  checkBackward('rlstream.events.Control', JSON.stringify(fine), JSON.stringify(current));
});

test('generated TypeScript types are fresh', () => {
  const res = spawnSync(process.execPath, ['--import', 'tsx', join(ROOT, 'schemas', 'codegen.ts'), '--check'], { cwd: ROOT, encoding: 'utf8' });
  assert.equal(res.status, 0, `schemas/generated/types.ts is stale: run npm run schemas:types\n${res.stdout}${res.stderr}`);
});

test('records written before external_reward and exclude_from_loss read as scored and trained on (their defaults)', () => {
  for (const name of ['TrajectoryCompleted', 'RewardedTrajectory', 'AdvantagedTrajectory'] as const) {
    const current = eventType(name);
    const decoded = current.fromBuffer(fixtureBytes(name), current.createResolver(historyType(name, 1))) as { trajectory: { external_reward: unknown }; reward?: { exclude_from_loss: unknown } };
    assert.equal(decoded.trajectory.external_reward, null, `${name}: external_reward`);
    if (name !== 'TrajectoryCompleted') assert.equal(decoded.reward!.exclude_from_loss, false, `${name}: exclude_from_loss`);
  }
});
