// One fault-test scenario: a private Kafka broker, the run's log on it, a fresh run and a supervisor for its
// role processes; torn down whatever the test body does. Skips (or fails, when services are required) without
// the Kafka jars.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestContext } from 'node:test';
import type { EventLog } from '../../core/log/types.ts';
import { PrivateBroker } from './broker.ts';
import { newRun, openRunLog, Supervisor, type RunSetup } from './harness.ts';

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
  }
}
