// The admin server that test/admin/fuzz.sh points schemathesis at: a real embedded log and chDB trace store in a
// temporary directory, filled by a synthetic run of four steps, with one read and one control token from
// FUZZ_READ_TOKEN and FUZZ_CONTROL_TOKEN. It prints `listening <url>` once it serves, and removes its directory
// on SIGTERM or SIGINT. The rate and failed-authentication limits are raised so that the fuzzer's requests
// reach the routes (both limits have tests of their own in auth.test.ts).
import { startAdminServer } from '../../admin/server.ts';
import { fixture } from './helpers.ts';
import { syntheticRun } from './synthetic-run.ts';
import { TOPICS } from '../../core/topics.ts';

const read = process.env['FUZZ_READ_TOKEN'];
const control = process.env['FUZZ_CONTROL_TOKEN'];
if (!read || !control) {
  process.stderr.write('fuzz-server: set FUZZ_READ_TOKEN and FUZZ_CONTROL_TOKEN (16 characters or more each)\n');
  process.exit(2);
}

const f = await fixture({ traces: true });
const run = await syntheticRun({ log: f.log, serde: f.serde, traces: f.store! });
f.runs.add({ id: run.runId, consumerGroups: { reward: { groupId: `${run.runId}.reward`, topics: [TOPICS.rolloutEvents] } } });
for (let i = 0; i < 4; i++) await run.step();
const server = await startAdminServer(f.ctx, {
  tokens: [
    { token: read, role: 'read', name: 'fuzz-read' },
    { token: control, role: 'control', name: 'fuzz-control' },
  ],
  env: {},
  port: Number(process.env['FUZZ_PORT'] ?? 0),
  rateLimit: { max: 1_000_000, timeWindowMs: 60_000 },
  authFailureLimit: { max: 1_000_000, timeWindowMs: 60_000 },
  tail: { pollTimeoutMs: 50 },
});
process.stdout.write(`listening ${server.url} run ${run.runId}\n`);

let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  await server.close();
  await run.stop();
  await f.close();
  process.exit(0);
};
process.on('SIGTERM', () => void stop());
process.on('SIGINT', () => void stop());
