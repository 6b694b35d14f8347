// The HTTP schema registry (core/serde/http-registry.ts) against a real Confluent-compatible server: Apicurio
// Registry's /apis/ccompat/v7, as infra/up.sh starts it. Subjects are random per test; the restart test runs a
// private registry (test/kafka/private-registry.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isRlstreamError } from '../../core/errors.ts';
import { EventSerde, subjectOf } from '../../core/serde/events.ts';
import { HttpSchemaRegistry } from '../../core/serde/http-registry.ts';
import { EVENT_NAMES, historyVersions } from '../../schemas/index.ts';
import { currentFixtureValue, historyType } from '../../schemas/snapshot.ts';
import { uniqueName } from '../log/conformance.ts';
import { PrivateRegistry } from './private-registry.ts';
import { service } from './services.ts';
import { key, oldNameIn, renamed, stripped, valueAt } from '../serde/renamed.ts';

const record = (name: string, fields: object[]) => JSON.stringify({ type: 'record', name, namespace: 'rlstream.test', fields });
const V1 = (name: string) => record(name, [{ name: 'a', type: 'int' }]);
// BACKWARD compatible with V1: a new field with a default.
const V2 = (name: string) => record(name, [{ name: 'a', type: 'int' }, { name: 'b', type: 'string', default: '' }]);
// Not BACKWARD compatible with V1: a new field without a default.
const BAD = (name: string) => record(name, [{ name: 'a', type: 'int' }, { name: 'c', type: 'long' }]);

const url = service('SCHEMA_REGISTRY_URL', 'HTTP schema registry');
if (url) {
  test('register is idempotent per schema text and getById returns the text from a fresh client', async () => {
    const reg = new HttpSchemaRegistry({ url });
    const subject = uniqueName('rlstream.test.A');
    const name = subject.replace(/[^A-Za-z0-9_]/g, '_');
    const id = await reg.register(subject, V1(name));
    assert.equal(await reg.register(subject, V1(name)), id);
    const fresh = new HttpSchemaRegistry({ url });
    assert.deepEqual(JSON.parse(await fresh.getById(id)), JSON.parse(V1(name)));
    // The same text under another subject keeps its id (ids name schemas, not subjects).
    assert.equal(await reg.register(uniqueName('rlstream.test.other'), V1(name)), id);
    await reg.close();
    await fresh.close();
  });

  test('versions lists ids oldest first; unknown subjects and ids are reported as such', async () => {
    const reg = new HttpSchemaRegistry({ url });
    const subject = uniqueName('rlstream.test.B');
    const name = subject.replace(/[^A-Za-z0-9_]/g, '_');
    assert.deepEqual(await reg.versions(subject), []);
    const v1 = await reg.register(subject, V1(name));
    const v2 = await reg.register(subject, V2(name));
    assert.notEqual(v1, v2);
    assert.deepEqual(await reg.versions(subject), [v1, v2]);
    await assert.rejects(reg.getById(2_000_000_000), (e) => isRlstreamError(e, 'SERDE_UNKNOWN_SCHEMA') && /schema id 2000000000, which this registry .* does not hold/.test(e.message));
    await reg.close();
  });

  test('a subject gets BACKWARD compatibility at its first registration here, and an incompatible schema is refused', async () => {
    const reg = new HttpSchemaRegistry({ url });
    const subject = uniqueName('rlstream.test.C');
    const name = subject.replace(/[^A-Za-z0-9_]/g, '_');
    await reg.register(subject, V1(name));
    assert.equal(await level(url, subject), 'BACKWARD');
    await assert.rejects(reg.register(subject, BAD(name)), (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE'));
    assert.equal((await reg.versions(subject)).length, 1);
    await reg.register(subject, V2(name));
    await reg.close();
  });

  test('a subject already at a stricter level than BACKWARD keeps it; one created elsewhere at NONE is raised to BACKWARD', async () => {
    const strict = uniqueName('rlstream.test.F');
    const loose = uniqueName('rlstream.test.N');
    const looseName = loose.replace(/[^A-Za-z0-9_]/g, '_');
    assert.equal(await setLevel(url, strict, 'FULL_TRANSITIVE'), 200);
    // Created by another client: the registry's default level (NONE on Apicurio).
    const created = await fetch(`${url}/subjects/${encodeURIComponent(loose)}/versions`, {
      method: 'POST',
      headers: { 'content-type': 'application/vnd.schemaregistry.v1+json' },
      body: JSON.stringify({ schema: V1(looseName) }),
    });
    assert.equal(created.status, 200);
    assert.equal(await level(url, loose), 'NONE');
    const reg = new HttpSchemaRegistry({ url });
    await reg.register(strict, V1(strict.replace(/[^A-Za-z0-9_]/g, '_')));
    await reg.register(loose, V2(looseName));
    assert.equal(await level(url, strict), 'FULL_TRANSITIVE');
    assert.equal(await level(url, loose), 'BACKWARD');
    await assert.rejects(reg.register(loose, BAD(looseName)), (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE'));
    await reg.close();
  });

  test('six clients registering the same new subject at once all get its one id (a lost race is not an incompatibility)', async () => {
    for (let round = 0; round < 3; round++) {
      const subject = uniqueName('rlstream.test.R');
      const name = subject.replace(/[^A-Za-z0-9_]/g, '_');
      const clients: HttpSchemaRegistry[] = Array.from({ length: 6 }, () => new HttpSchemaRegistry({ url }));
      const results: PromiseSettledResult<number>[] = await Promise.allSettled(clients.map((c) => c.register(subject, V1(name))));
      const failed: string[] = results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason));
      assert.deepEqual(failed, [], `round ${round}`);
      const ids = new Set<number>(results.map((r) => (r as PromiseFulfilledResult<number>).value));
      assert.equal(ids.size, 1, `round ${round}: ids ${[...ids]}`);
      assert.deepEqual(await clients[0]!.versions(subject), [...ids]);
      await Promise.all(clients.map((c) => c.close()));
    }
  });

  test('an unreachable registry is REGISTRY_UNAVAILABLE and retriable; a bad URL is CONFIG_INVALID', async () => {
    const reg = new HttpSchemaRegistry({ url: 'http://127.0.0.1:1/apis/ccompat/v7', maxRetries: 0, timeoutMs: 2000 });
    await assert.rejects(reg.register('rlstream.test.D', V1('D')), (e) => isRlstreamError(e, 'REGISTRY_UNAVAILABLE') && e.retriable);
    await reg.close();
    assert.throws(() => new HttpSchemaRegistry({ url: 'not a url' }), (e) => isRlstreamError(e, 'CONFIG_INVALID') && /registry\.url/.test(e.message));
    assert.throws(() => new HttpSchemaRegistry({ url: 'ftp://x' }), (e) => isRlstreamError(e, 'CONFIG_INVALID'));
  });

  test('EventSerde registers the event contract over HTTP; another process-like instance decodes its bytes', async () => {
    const writer = await new EventSerde(new HttpSchemaRegistry({ url })).init();
    const reader = new EventSerde(new HttpSchemaRegistry({ url })); // no init: it must fetch writer schemas by id
    for (const name of EVENT_NAMES) {
      const value = currentFixtureValue(name);
      const bytes = writer.encode(name, value as never);
      const decoded = await reader.decode(bytes);
      assert.equal(decoded.name, name);
      assert.equal(decoded.schemaId, writer.schemaId(name));
      // Byte equality after re-encoding (floats decode to their float32 value, so compare the wire form).
      assert.ok(writer.encode(name, decoded.value as never).equals(bytes), `${name} does not round-trip`);
    }
    await writer.registry.close();
    await reader.registry.close();
  });
}

async function level(url: string, subject: string): Promise<string | undefined> {
  const body = (await (await fetch(`${url}/config/${encodeURIComponent(subject)}`)).json()) as { compatibilityLevel?: string };
  return body.compatibilityLevel;
}

async function setLevel(url: string, subject: string, compatibility: string): Promise<number> {
  const res = await fetch(`${url}/config/${encodeURIComponent(subject)}`, {
    method: 'PUT',
    headers: { 'content-type': 'application/vnd.schemaregistry.v1+json' },
    body: JSON.stringify({ compatibility }),
  });
  await res.arrayBuffer();
  return res.status;
}

if (PrivateRegistry.installed()) {
  test("Apicurio's BACKWARD check accepts each renamed field with its old name as alias, and refuses it without", { timeout: 240_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-registry-'));
    const registry = await PrivateRegistry.start(dir);
    try {
      const reg = new HttpSchemaRegistry({ url: registry.url });
      const fields = renamed();
      assert.ok(fields.length >= 3, `renamed fields: ${fields.map(key).join(', ')}`);
      // Every old version of each renamed event, in order (a subject takes no older schema once today's is in).
      const ids = new Map<string, number>();
      for (const event of new Set(fields.map((r) => r.event))) {
        for (const v of historyVersions(event).slice(0, -1)) ids.set(`${event} v${v.version}`, await reg.register(subjectOf(event), JSON.stringify(v.schema)));
      }
      for (const r of fields) await assert.rejects(reg.register(subjectOf(r.event), JSON.stringify(stripped(r))), (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE'), key(r));
      // Today's contract registers over the old versions, and reads what they wrote.
      const serde = await new EventSerde(reg).init();
      for (const r of fields) {
        let read = 0;
        for (const v of historyVersions(r.event)) {
          const oldName = oldNameIn(v.schema, r);
          if (oldName === undefined) continue;
          const old = historyType(r.event, v.version);
          const value = old.random();
          const framed = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), old.toBuffer(value)]);
          framed.writeUInt32BE(ids.get(`${r.event} v${v.version}`)!, 1);
          const d = await serde.decode(framed);
          assert.deepEqual(valueAt(d.value, r.parent)[r.name], valueAt(value, r.parent)[oldName], `${key(r)} v${v.version}`);
          read++;
        }
        assert.ok(read > 0, `${key(r)}: no history version with the old name`);
      }
      await reg.close();
    } finally {
      await registry.halt('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('schema ids outlive a registry restart, a SIGKILL included: the log keeps records framed with them', { timeout: 240_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-registry-'));
    const registry = await PrivateRegistry.start(dir);
    try {
      const writer = await new EventSerde(new HttpSchemaRegistry({ url: registry.url })).init();
      const ids = new Map(EVENT_NAMES.map((n) => [n, writer.schemaId(n)]));
      const bytes = EVENT_NAMES.map((n) => writer.encode(n, currentFixtureValue(n) as never));
      await writer.registry.close();
      for (const signal of ['SIGKILL', 'SIGTERM'] as const) {
        await registry.halt(signal);
        await registry.resume();
        // A reader that never registered anything resolves the old ids to the same schemas.
        const reader = new EventSerde(new HttpSchemaRegistry({ url: registry.url }));
        for (const [i, b] of bytes.entries()) assert.equal((await reader.decode(b)).name, EVENT_NAMES[i], `after ${signal}`);
        // Registering the contract again gives the same ids, and a new schema a new one.
        await reader.init();
        for (const n of EVENT_NAMES) assert.equal(reader.schemaId(n), ids.get(n), `${n} after ${signal}`);
        const fresh = await reader.registry.register(`rlstream.test.after${signal}`, V1(`after${signal}`));
        assert.ok(![...ids.values()].includes(fresh), `a new schema got an old id (${fresh}) after ${signal}`);
        await reader.registry.close();
      }
    } finally {
      await registry.halt('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });
} else {
  test('schema ids outlive a registry restart', { skip: 'Apicurio is not installed: run infra/setup.sh' }, () => {});
}
