// The distributed shape starts as the README says: all five roles (`rlstream worker <role>`) at once on a fresh
// schema registry, twice. No role may exit (their first registrations race on every subject); the
// registry holds the contract's subjects at BACKWARD. Then SIGTERM ends each role cleanly (exit 0), one at a
// time while the others run (each restarted, as a supervisor would) in the first round, all at once in the
// second; the first round runs to its end and audits that nothing was lost: every started trajectory consumed
// once or accounted for, steps and versions contiguous, no duplicate trace, the trace sink's lag 0.
// A private Kafka broker, a private registry (fresh data) and a fresh run per round.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { EventSerde, subjectOf } from '../../core/serde/events.ts';
import { HttpSchemaRegistry } from '../../core/serde/http-registry.ts';
import { TOPICS } from '../../core/topics.ts';
import { EVENT_NAMES } from '../../schemas/index.ts';
import { PrivateRegistry } from '../kafka/private-registry.ts';
import { service } from '../kafka/services.ts';
import { auditRun, collectRun, dropDatabase, traceDuplicates } from '../../testkit/audit.ts';
import { PrivateBroker } from '../../testkit/kafka-broker.ts';
import { newRun, openRunLog, progress, ROLES, Supervisor, type Role, type RoleProcess } from '../../testkit/harness.ts';
import { drainRun, type Scenario } from './scenario.ts';

const ROUNDS = 2;
/** How long every role must stay up once all are ready (the failure showed at registration, within 20 s of the start). */
const ALIVE_MS = 3_000;
/** Rows of the first round's dataset: enough that the rollout worker is still running when it is signalled. */
const ROUND1_ROWS = 72;

// The roles log at info, so the test sees each one's 'role starting' (its signal handlers are installed then: a
// SIGTERM while node is still loading the modules ends the process by the signal, before anything began).
process.env['RLSTREAM_LOG_LEVEL'] = 'info';

const clickhouseUrl = service('CLICKHOUSE_URL', 'distributed start: five roles at once on a fresh registry');
if (clickhouseUrl) {
  test('five roles at once on a fresh registry, twice: none exits; SIGTERM ends each with 0 and nothing is lost', { timeout: 600_000 }, async (t) => {
    if (!PrivateBroker.libs() || !PrivateRegistry.installed()) {
      if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') assert.fail('Kafka or Apicurio is not installed (infra/setup.sh)');
      return t.skip('Kafka or Apicurio is not installed: run infra/setup.sh');
    }
    const t0 = Date.now();
    const note = (what: string) => process.stderr.write(`# start ${((Date.now() - t0) / 1000).toFixed(0)}s: ${what}\n`);
    for (let round = 1; round <= ROUNDS; round++) {
      // A fresh broker too: the records of an earlier round carry the ids of an earlier registry.
      const brokerDir = mkdtempSync(join(tmpdir(), 'rlstream-start-broker-'));
      const broker = await PrivateBroker.start(brokerDir);
      const log = await openRunLog(broker.brokers);
      try {
        const registryDir = mkdtempSync(join(tmpdir(), 'rlstream-start-registry-'));
        const registry = await PrivateRegistry.start(registryDir);
        const run = await newRun(`start${round}`, broker.brokers, { 'registry.url': registry.url, ...(round === 1 ? { 'task.train_rows': ROUND1_ROWS } : {}) });
        const sup = new Supervisor(run);
        // Rounds after the first run the default dataset, which the rollout worker may finish while the other roles
        // are still starting: it then stays down (exit 0) instead of being started again.
        if (round > 1) sup.finishing = true;
        try {
          sup.start();
          for (const r of ROLES) watch(sup.procs.get(r)!);
          // Every role gets through start-up (its schemas registered: 'role ready') and stays up.
          const readyBy = Date.now() + 150_000;
          while (ROLES.some((r) => !said(sup.procs.get(r)!, 'ready'))) {
            assert.deepEqual(sup.crashes, [], `round ${round}: a role exited during start-up`);
            if (Date.now() > readyBy) assert.fail(`round ${round}: roles not ready 150 s after the start: ${ROLES.filter((r) => !said(sup.procs.get(r)!, 'ready')).join(', ')}`);
            await sleep(250);
          }
          await sleep(ALIVE_MS);
          assert.deepEqual(sup.crashes, [], `round ${round}: a role exited during start-up`);
          assert.deepEqual(sup.starts, { rollout: 1, reward: 1, advantage: 1, trainer: 1, traces: 1 }, `round ${round}: every role started once`);
          for (const name of EVENT_NAMES) assert.equal(await level(registry.url, subjectOf(name)), 'BACKWARD', `round ${round}: ${name}`);
          note(`round ${round}: five roles up, ${JSON.stringify(await progress(log, run.runId))}`);
          if (round === 1) await sigtermEachAndAudit(log, run, sup, registry.url, clickhouseUrl, note);
          else {
            const codes = await sigtermAll(sup);
            assert.deepEqual(codes, Object.fromEntries(ROLES.map((r) => [r, 'exit 0'])), `round ${round}: SIGTERM to all at once`);
          }
        } finally {
          await sup.stopAll(2000);
          await registry.halt('SIGKILL');
          rmSync(registryDir, { recursive: true, force: true });
          rmSync(run.dir, { recursive: true, force: true });
          await dropDatabase(clickhouseUrl, run.database).catch(() => {});
        }
      } finally {
        await log.close().catch(() => {});
        await broker.halt('SIGKILL');
        rmSync(brokerDir, { recursive: true, force: true });
      }
    }
  });
}

/** What each role process has logged of 'role starting' and 'role ready' (its output tail may move past them: watched live). */
const seen = new WeakMap<RoleProcess, Set<string>>();
function watch(p: RoleProcess): void {
  const marks = new Set<string>();
  seen.set(p, marks);
  const see = (d: Buffer) => {
    const text = d.toString();
    for (const m of ['starting', 'ready']) if (text.includes(`"role ${m}"`)) marks.add(m);
  };
  p.child.stdout!.on('data', see);
  p.child.stderr!.on('data', see);
}
function said(p: RoleProcess, mark: 'starting' | 'ready'): boolean {
  return (seen.get(p)?.has(mark) ?? false) || p.output.includes(`"role ${mark}"`);
}

/** The role's current process once it has installed its signal handlers (the supervisor may have just started it again). */
async function current(sup: Supervisor, role: Role): Promise<RoleProcess> {
  const by = Date.now() + 60_000;
  for (;;) {
    const p = sup.procs.get(role)!;
    if (!seen.has(p)) watch(p);
    if (said(p, 'starting') || !p.running) return p;
    if (Date.now() > by) assert.fail(`${role}: its process did not start in 60 s`);
    await sleep(20);
  }
}

async function level(url: string, subject: string): Promise<string | undefined> {
  const res = await fetch(`${url}/config/${encodeURIComponent(subject)}`);
  return ((await res.json()) as { compatibilityLevel?: string }).compatibilityLevel;
}

function outcome(e: { code: number | null; signal: NodeJS.Signals | null }): string {
  return e.signal ? `signal ${e.signal}` : `exit ${e.code}`;
}

/** SIGTERM to every role at once; how each process ended (a SIGKILL after 30 s shows as such). */
async function sigtermAll(sup: Supervisor): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  await Promise.all(
    ROLES.map(async (role) => {
      const p = await current(sup, role);
      const kill = setTimeout(() => void p.kill('SIGKILL'), 30_000);
      p.child.kill('SIGTERM');
      const e = await p.exited;
      clearTimeout(kill);
      out[role] = outcome(e);
      if (e.code !== 0) process.stderr.write(`# ${role} output: ${p.output.slice(-2000)}\n`);
    }),
  );
  return Object.fromEntries(ROLES.map((r) => [r, out[r]!]));
}

/** SIGTERM each role in turn (the supervisor restarts it), then run to the end and audit the run. */
async function sigtermEachAndAudit(log: Scenario['log'], run: Scenario['run'], sup: Supervisor, registryUrl: string, clickhouseUrl: string, note: (w: string) => void): Promise<void> {
  const ended: Record<string, string> = {};
  for (const role of ROLES as readonly Role[]) {
    const p = await current(sup, role);
    const kill = setTimeout(() => void p.kill('SIGKILL'), 30_000);
    p.child.kill('SIGTERM');
    const e = await p.exited;
    clearTimeout(kill);
    ended[role] = outcome(e);
    if (e.code !== 0) process.stderr.write(`# ${role} output: ${p.output.slice(-2000)}\n`);
    // The supervisor starts it again (after 100 ms, seconds before its first output); the next role is
    // signalled once this one is back.
    const back = Date.now() + 60_000;
    while (Date.now() < back && sup.procs.get(role) === p) await sleep(20);
    await current(sup, role);
  }
  assert.deepEqual(ended, Object.fromEntries(ROLES.map((r) => [r, 'exit 0'])), 'SIGTERM to each role in turn');
  const serde = await new EventSerde(new HttpSchemaRegistry({ url: registryUrl })).init();
  try {
    const s = { log, run, sup } as Scenario;
    const d = await drainRun(s, serde, 90_000, async (x) => void note(`draining: ${JSON.stringify(x)}`));
    assert.ok(d.rolloutDone, 'the rollout worker finished its dataset');
    assert.ok(d.consumed >= d.started, `the trainer consumed ${d.consumed} of ${d.started} started trajectories`);
    // The trace sink catches up on every topic it reads: lag 0, transactional partitions included.
    let lag = -1;
    const by = Date.now() + 40_000;
    while (Date.now() < by) {
      lag = 0;
      for (const topic of [TOPICS.rolloutEvents, TOPICS.rewarded, TOPICS.advantaged, TOPICS.trainSteps, TOPICS.policyVersions]) lag += (await log.lag(`${run.runId}.traces`, topic).catch(() => [{ lag: 1 }])).reduce((n, l) => n + l.lag, 0);
      if (lag === 0) break;
      await sleep(500);
    }
    assert.equal(lag, 0, "the trace sink's lag");
    const codes = await sigtermAll(sup);
    assert.deepEqual(sup.crashes, [], 'no role crashed');
    for (const role of ROLES) if (role !== 'rollout') assert.equal(codes[role], 'exit 0', `${role} at the end`);
    const records = await collectRun(log, serde, run.runId);
    const audit = auditRun(records);
    assert.deepEqual(audit.problems, [], JSON.stringify(audit));
    assert.equal(audit.started, ROUND1_ROWS * 4, 'every row of the dataset started its group');
    const traces = await traceDuplicates(clickhouseUrl, run.database, run.runId);
    assert.deepEqual(traces.problems, []);
    assert.equal(traces.tables['train_steps']!.final, records.steps.length);
    assert.equal(traces.tables['trajectories']!.final, records.completed.size);
    assert.equal(traces.tables['trajectory_starts']!.final, records.started.size);
    note(`round 1 audit: ${JSON.stringify(audit)}; traces ${JSON.stringify(traces.tables)}`);
  } finally {
    await serde.registry.close();
  }
}
