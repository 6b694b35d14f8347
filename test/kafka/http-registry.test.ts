// The HTTP schema registry (core/serde/http-registry.ts) against a real Confluent-compatible server: Apicurio
// Registry's /apis/ccompat/v7, as infra/up.sh starts it. Subjects are random per test.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isRlstreamError } from '../../core/errors.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { HttpSchemaRegistry } from '../../core/serde/http-registry.ts';
import { EVENT_NAMES } from '../../schemas/index.ts';
import { fixtureValue } from '../../schemas/snapshot.ts';
import { uniqueName } from '../log/conformance.ts';
import { service } from './services.ts';

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
    await assert.rejects(reg.getById(2_000_000_000), (e) => isRlstreamError(e, 'SERDE_UNKNOWN_SCHEMA'));
    await reg.close();
  });

  test('an incompatible schema is refused with REGISTRY_INCOMPATIBLE under BACKWARD compatibility', async () => {
    const reg = new HttpSchemaRegistry({ url });
    const subject = uniqueName('rlstream.test.C');
    const name = subject.replace(/[^A-Za-z0-9_]/g, '_');
    await reg.register(subject, V1(name));
    const res = await fetch(`${url}/config/${encodeURIComponent(subject)}`, {
      method: 'PUT',
      headers: { 'content-type': 'application/vnd.schemaregistry.v1+json' },
      body: JSON.stringify({ compatibility: 'BACKWARD' }),
    });
    assert.equal(res.status, 200);
    await assert.rejects(reg.register(subject, BAD(name)), (e) => isRlstreamError(e, 'REGISTRY_INCOMPATIBLE'));
    assert.equal((await reg.versions(subject)).length, 1);
    await reg.register(subject, V2(name));
    await reg.close();
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
      const value = fixtureValue(name);
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
