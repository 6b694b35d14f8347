// Exactly-once consume–transform–produce on real Kafka under crashes: a processor (fixtures/eos-processor.ts)
// is killed with SIGKILL at random moments, at least 20 times, and restarted each time; afterwards the output
// topic, read with read_committed, holds every input id exactly once. On each Kafka client.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { pollUntil, uniqueName } from '../log/conformance.ts';
import { kafkaClients, openTestKafkaLog, service } from './services.ts';

const PROCESSOR = fileURLToPath(new URL('./fixtures/eos-processor.ts', import.meta.url));
const INPUTS = 4000;
const KILLS = 20;

interface Life {
  child: ChildProcess;
  ready: Promise<void>;
  exited: Promise<number | null>;
  /** Transactions this instance committed (from its stdout). */
  commits(): number;
}

function start(args: string[]): Life {
  const child = spawn(process.execPath, ['--import', 'tsx', PROCESSOR, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let commits = 0;
  child.stdout!.on('data', (d: Buffer) => (commits += d.toString().split('committed').length - 1));
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()).length > 4000 && (stderr = stderr.slice(-4000)));
  const ready = new Promise<void>((resolve) => child.stdout!.on('data', (d: Buffer) => d.toString().includes('ready') && resolve()));
  const exited = new Promise<number | null>((resolve) =>
    child.on('exit', (code, signal) => {
      if (signal !== 'SIGKILL' && code !== 0 && stderr) process.stderr.write(`processor exited ${code}: ${stderr}\n`);
      resolve(code);
    }),
  );
  return { child, ready, exited, commits: () => commits };
}

const brokers = service('KAFKA_BROKERS', 'exactly-once under SIGKILL on Kafka');
for (const client of brokers ? kafkaClients('exactly-once under SIGKILL on Kafka') : []) {
  test(`a consume-transform-produce processor killed 20 times writes every input exactly once (${client})`, { timeout: 180_000 }, async () => {
    const log = await openTestKafkaLog(brokers!, client);
    try {
      const input = uniqueName('eos-in');
      const output = uniqueName('eos-out');
      const groupId = uniqueName('eos-group');
      const transactionalId = uniqueName('eos-tx');
      await log.createTopic({ name: input, partitions: 3 });
      await log.createTopic({ name: output, partitions: 3 });
      const producer = await log.producer();
      const ids = Array.from({ length: INPUTS }, (_, i) => `id-${String(i).padStart(5, '0')}`);
      for (let i = 0; i < INPUTS; i += 500) await producer.send(input, ids.slice(i, i + 500).map((id) => ({ key: id, value: Buffer.from(id) })));
      await producer.close();

      const args = [brokers!, input, output, groupId, transactionalId, '30', client];
      const t0 = Date.now();
      let killed = 0;
      let midWork = 0;
      while (killed < KILLS) {
        const p = start(args);
        // Half the kills land anywhere (start-up, joining, fencing), half while it is processing.
        if (killed % 2 === 1) await Promise.race([p.ready, p.exited]);
        await new Promise((r) => setTimeout(r, 150 + Math.random() * 1200));
        p.child.kill('SIGKILL');
        await p.exited;
        killed++;
        if (p.commits() > 0) midWork++;
      }
      const killPhase = Date.now() - t0;
      const lagAfterKills = (await log.lag(groupId, input)).reduce((s, l) => s + l.lag, 0);
      assert.ok(midWork >= KILLS / 4, `only ${midWork} of ${KILLS} kills hit a processor that had started committing`);

      // A last instance runs until the group has consumed everything.
      const last = start(args);
      const end = Date.now() + 90_000;
      let lag = Infinity;
      while (Date.now() < end) {
        lag = (await log.lag(groupId, input)).reduce((s, l) => s + l.lag, 0);
        if (lag === 0) break;
        await new Promise((r) => setTimeout(r, 500));
      }
      last.child.kill('SIGKILL');
      await last.exited;
      assert.equal(lag, 0, 'the processor did not finish the input');

      const reader = await log.consumer({ groupId: uniqueName('eos-check'), topics: [output], readCommitted: true });
      const got = await pollUntil(reader, INPUTS, 30_000);
      // Anything beyond INPUTS would be a duplicate: give it a moment to show up.
      got.push(...(await pollUntil(reader, 1, 1500)));
      await reader.close();
      const values = got.map((r) => r.value.toString());
      const counts = new Map<string, number>();
      for (const v of values) counts.set(v, (counts.get(v) ?? 0) + 1);
      const duplicates = [...counts].filter(([, n]) => n > 1);
      const missing = ids.filter((id) => !counts.has(id));
      assert.deepEqual(duplicates.slice(0, 5), [], `${duplicates.length} ids written more than once`);
      assert.deepEqual(missing.slice(0, 5), [], `${missing.length} ids missing`);
      assert.equal(values.length, INPUTS);
      assert.deepEqual([...counts.keys()].sort(), ids);
      process.stderr.write(
        `# exactly-once (${client}): ${killed} kills (${midWork} after commits had begun) in ${(killPhase / 1000).toFixed(1)}s; ` +
          `${INPUTS - lagAfterKills} of ${INPUTS} inputs done when the kills ended; every record once\n`,
      );
    } finally {
      await log.close();
    }
  });
}
