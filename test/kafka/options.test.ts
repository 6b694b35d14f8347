// Kafka log options and error mapping, without a broker: config errors name the exact field; kafkajs errors
// map to our codes (fencing, an unreachable cluster). The unreachable case uses a real connection attempt.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import kafkajs from 'kafkajs';
import { isRlstreamError } from '../../core/errors.ts';
import { compileKafkaLogOptions, openKafkaLog } from '../../core/log/kafka/index.ts';
import { fromKafka } from '../../core/log/kafka/errors.ts';
import { openLog } from '../../core/log/open.ts';

const require = createRequire(import.meta.url);
const { createErrorFromCode } = require('kafkajs/src/protocol/error') as { createErrorFromCode(code: number): Error };

function configError(input: unknown, message: RegExp): void {
  assert.throws(
    () => compileKafkaLogOptions(input),
    (e) => isRlstreamError(e, 'CONFIG_INVALID') && message.test(e.message),
  );
}

test('defaults are filled in and the result is frozen', () => {
  const o = compileKafkaLogOptions({ brokers: ['127.0.0.1:19092'] });
  assert.equal(o.clientId, 'rlstream');
  assert.equal(o.compression, 'none');
  assert.equal(o.ssl, false);
  assert.equal(o.sasl, null);
  assert.equal(o.maxBufferedRecords, 5000);
  assert.ok(Object.isFrozen(o) && Object.isFrozen(o.brokers));
  // The `kind` that core/log/open.ts passes along is accepted.
  assert.equal(compileKafkaLogOptions({ kind: 'kafka', brokers: ['[::1]:9092', 'kafka-0.example:9093'] }).brokers.length, 2);
});

test('each invalid field is named in the error', () => {
  configError({}, /^log\.brokers must be a non-empty list/);
  configError({ brokers: [] }, /^log\.brokers must be a non-empty list/);
  configError({ brokers: ['localhost'] }, /^log\.brokers\[0\] must be host:port, got "localhost"/);
  configError({ brokers: ['a:1', 7] }, /^log\.brokers\[1\] must be host:port, got 7/);
  configError({ brokers: ['a:1'], bootstrap: 'x' }, /^log\.bootstrap is not a known Kafka log option/);
  configError({ brokers: ['a:1'], compression: 'lz4' }, /^log\.compression must be one of none, gzip, got "lz4"/);
  configError({ brokers: ['a:1'], sessionTimeoutMs: 10.5 }, /^log\.sessionTimeoutMs must be an integer >= 1000, got 10\.5/);
  configError({ brokers: ['a:1'], heartbeatIntervalMs: 5000 }, /^log\.heartbeatIntervalMs \(5000\) must be at most a third of sessionTimeoutMs \(10000\)/);
  configError({ brokers: ['a:1'], ssl: 'yes' }, /^log\.ssl must be true, false or an object/);
  configError({ brokers: ['a:1'], ssl: { ca: 'not pem' } }, /^log\.ssl\.ca must be PEM text/);
  configError({ brokers: ['a:1'], ssl: { ca: ['-----BEGIN CERTIFICATE-----', 'x'] } }, /^log\.ssl\.ca\[1\] must be PEM text/);
  configError({ brokers: ['a:1'], ssl: { cert: '-----BEGIN CERTIFICATE-----' } }, /^log\.ssl\.key is required/);
  configError({ brokers: ['a:1'], ssl: { verify: false } }, /^log\.ssl\.verify is not a known option/);
  configError({ brokers: ['a:1'], sasl: { mechanism: 'gssapi', username: 'u', password: 'p' } }, /^log\.sasl\.mechanism must be one of plain, scram-sha-256, scram-sha-512/);
  configError({ brokers: ['a:1'], sasl: { mechanism: 'plain', username: '', password: 'p' } }, /^log\.sasl\.username must be a non-empty string/);
});

test('SASL and SSL options pass through compiled', () => {
  const o = compileKafkaLogOptions({
    brokers: ['a:1'],
    ssl: { rejectUnauthorized: false, servername: 'kafka.internal' },
    sasl: { mechanism: 'scram-sha-512', username: 'u', password: 'secret' },
  });
  assert.deepEqual(o.ssl, { rejectUnauthorized: false, servername: 'kafka.internal' });
  assert.deepEqual(o.sasl, { mechanism: 'scram-sha-512', username: 'u', password: 'secret' });
});

test('kafkajs errors map to our codes', () => {
  const fenced = fromKafka(createErrorFromCode(47), 'commit'); // INVALID_PRODUCER_EPOCH
  assert.equal(fenced.code, 'LOG_FENCED');
  assert.equal(fromKafka(createErrorFromCode(90), 'commit').code, 'LOG_FENCED'); // PRODUCER_FENCED, unknown to kafkajs
  assert.equal(fromKafka(createErrorFromCode(3), 'send').code, 'LOG_UNKNOWN_TOPIC');
  assert.equal(fromKafka(createErrorFromCode(10), 'send').code, 'LOG_RECORD_TOO_LARGE');
  const wrapped = new kafkajs.KafkaJSNumberOfRetriesExceeded(new kafkajs.KafkaJSConnectionError('Connection error: ECONNREFUSED'), { retryCount: 5, retryTime: 100 });
  const unavailable = fromKafka(wrapped, 'send');
  assert.equal(unavailable.code, 'LOG_UNAVAILABLE');
  assert.equal(unavailable.retriable, true);
});

test('an unreachable cluster fails at open with LOG_UNAVAILABLE (retriable), through core/log/open.ts too', async () => {
  const t0 = Date.now();
  await assert.rejects(
    openKafkaLog({ brokers: ['127.0.0.1:1'], connectionTimeoutMs: 500 }),
    (e) => isRlstreamError(e, 'LOG_UNAVAILABLE') && e.retriable && /127\.0\.0\.1:1/.test(e.message),
  );
  await assert.rejects(
    openLog({ kind: 'kafka', brokers: ['127.0.0.1:1'], connectionTimeoutMs: 500 }),
    (e) => isRlstreamError(e, 'LOG_UNAVAILABLE'),
  );
  assert.ok(Date.now() - t0 < 30_000, 'giving up took too long');
});

test('log.client picks the client library; an unknown one fails the run config naming the field', async () => {
  assert.equal(compileKafkaLogOptions({ brokers: ['b:1'], client: 'librdkafka' }).client, 'librdkafka');
  configError({ brokers: ['b:1'], client: 'rdkafka' }, /^log\.client must be one of kafkajs, librdkafka, got "rdkafka"$/);
  const { compileRunConfig } = await import('../../cli/config/run-config.ts');
  assert.throws(
    () => compileRunConfig({ log: { kind: 'kafka', brokers: 'b:1', client: 'rdkafka' } }, '/tmp'),
    (e) => e instanceof Error && /log\.client/.test(e.message) && /kafkajs, librdkafka/.test(e.message),
  );
  const run = compileRunConfig({ log: { kind: 'kafka', brokers: 'b:1', client: 'librdkafka' } }, '/tmp');
  assert.equal(run.log.kind === 'kafka' && run.log.client, 'librdkafka');
});

test('choosing librdkafka without its build fails at open, naming the command that builds it', async () => {
  // A child process: the binding, once loaded, stays loaded in this one. An empty infra directory stands for a
  // machine where infra/setup.sh has not built it (node_modules does not have it either).
  const { spawnSync } = await import('node:child_process');
  const { mkdtempSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const empty = mkdtempSync(join(tmpdir(), 'rlstream-no-infra-'));
  try {
    const script = `import { openKafkaLog } from ${JSON.stringify(new URL('../../core/log/kafka/index.ts', import.meta.url).href)};
      try { await openKafkaLog({ brokers: ['127.0.0.1:1'], client: 'librdkafka', connectionTimeoutMs: 200 }); console.log('opened'); }
      catch (e) { console.log(e.code + ': ' + e.message); }`;
    const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { env: { ...process.env, RLSTREAM_INFRA_DIR: empty }, encoding: 'utf8', timeout: 60_000 });
    assert.match(r.stdout, /^CONFIG_INVALID: log\.client is librdkafka, but @confluentinc\/kafka-javascript [\d.]+ is not built: run `bash infra\/setup\.sh --kafka-native`/, r.stderr);
  } finally {
    rmSync(empty, { recursive: true, force: true });
  }
});

test("log.client_debug takes librdkafka's debug contexts, raises the client's log level, and refuses what would log secrets", async () => {
  const o = compileKafkaLogOptions({ brokers: ['b:1'], client: 'librdkafka', clientDebug: 'eos, broker,cgrp' });
  assert.equal(o.clientDebug, 'eos,broker,cgrp');
  assert.equal(o.clientLogLevel, 'debug');
  assert.equal(compileKafkaLogOptions({ brokers: ['b:1'], client: 'librdkafka' }).clientDebug, null);
  configError({ brokers: ['b:1'], client: 'kafkajs', clientDebug: 'broker' }, /^log\.clientDebug is librdkafka's debug setting and log\.client is kafkajs: remove it, or set log\.client: librdkafka$/);
  configError({ brokers: ['b:1'], client: 'librdkafka', clientDebug: 'broker,conf' }, /^log\.clientDebug names "conf": use librdkafka debug contexts from generic, broker/);
  configError({ brokers: ['b:1'], client: 'librdkafka', clientDebug: 'all' }, /names "all"/);
  // The run config's keys: named as the YAML file spells them.
  const { compileRunConfig } = await import('../../cli/config/run-config.ts');
  const run = compileRunConfig({ log: { kind: 'kafka', brokers: 'b:1', client_debug: 'eos,cgrp', client_log_level: 'info' } }, '/tmp');
  assert.ok(run.log.kind === 'kafka' && run.log.clientDebug === 'eos,cgrp' && run.log.clientLogLevel === 'info');
  for (const [log, message] of [
    [{ kind: 'kafka', brokers: 'b:1', client: 'kafkajs', client_debug: 'eos' }, /log\.client_debug: is librdkafka's debug setting and log\.client is kafkajs/],
    [{ kind: 'kafka', brokers: 'b:1', client_debug: 'eos,coord' }, /log\.client_debug: names "coord": use librdkafka debug contexts from generic, broker/],
    [{ kind: 'kafka', brokers: 'b:1', client_log_level: 'trace' }, /log\.client_log_level/],
  ] as const)
    assert.throws(() => compileRunConfig({ log }, '/tmp'), (e) => e instanceof Error && message.test(e.message), JSON.stringify(log));
});
