// One fault-test scenario: a private Kafka broker, the run's log on it, a fresh run and a supervisor for its
// role processes; torn down whatever the test body does. Skips (or fails, when services are required) without
// the Kafka jars.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import type { EventLog } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { collectStarted, consumedIds, dropDatabase } from '../../testkit/audit.ts';
import { PrivateBroker } from '../../testkit/kafka-broker.ts';
import { newRun, openRunLog, Supervisor, type RunSetup } from '../../testkit/harness.ts';

export interface Scenario {
  broker: PrivateBroker;
  /** The run's log on the broker; a body that restarts the broker reopens it here so teardown closes it. */
  log: EventLog;
  run: RunSetup;
  sup: Supervisor;
}

export async function withPrivateRun(t: TestContext, name: string, overrides: Record<string, string | number>, body: (s: Scenario) => Promise<void>): Promise<void> {
  if (!PrivateBroker.libs()) {
    if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') assert.fail('Kafka jars are not installed (infra/setup.sh)');
    return t.skip('Kafka jars are not installed: run infra/setup.sh');
  }
  const dir = mkdtempSync(join(tmpdir(), `rlstream-${name}-broker-`));
  const broker = await PrivateBroker.start(dir);
  const s: Scenario = { broker, log: await openRunLog(broker.brokers), run: await newRun(name, broker.brokers, overrides), sup: null as unknown as Supervisor };
  s.sup = new Supervisor(s.run);
  try {
    await body(s);
  } finally {
    await s.sup.stopAll(2000);
    await s.log.close().catch(() => {});
    await broker.halt('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
    rmSync(s.run.dir, { recursive: true, force: true });
    const url = process.env['CLICKHOUSE_URL'];
    if (url) await dropDatabase(url, s.run.database).catch(() => {});
  }
}

export interface Drained {
  rolloutDone: boolean;
  started: number;
  consumed: number;
}

/** The run's end: the rollout worker finishes its dataset, then the trainer consumes until every started
 * trajectory is in a committed step or `drainMs` passes (the audit then says what is missing). */
export async function drainRun(s: Scenario, serde: EventSerde, drainMs: number, onWait: (d: Drained) => Promise<void> | void = () => {}): Promise<Drained> {
  s.sup.finishing = true;
  const d: Drained = { rolloutDone: await s.sup.waitDone('rollout', 60_000), started: 0, consumed: 0 };
  const by = Date.now() + drainMs;
  while (Date.now() < by) {
    // Reads can fail while the broker is settling (after a restart); the next round tries again.
    d.started = (await collectStarted(s.log, serde, s.run.runId).catch(() => new Set())).size;
    d.consumed = new Set(await consumedIds(s.log, serde, s.run.runId).catch(() => [])).size;
    if (d.rolloutDone && d.consumed >= d.started) break;
    await onWait(d);
    await sleep(1500);
  }
  return d;
}
