// Every admin route with valid and invalid input, through inject() (no network), against a real embedded log
// and a real chDB trace store filled by the synthetic run. Bad input must be a 4xx with an ADM_ERR_ code.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { buildAdminServer } from '../../admin/server.ts';
import { TOPICS } from '../../core/topics.ts';
import { rowsOf } from '../../consumers/traces/rows.ts';
import { auth, CONTROL_TOKEN, fixture, READ_TOKEN, TOKENS, type Fixture } from './helpers.ts';
import { syntheticRun, type RunningRun } from './synthetic-run.ts';

let f: Fixture;
let app: FastifyInstance;
let run: RunningRun;
const R = auth(READ_TOKEN);
const C = auth(CONTROL_TOKEN);

function json(res: LightMyRequestResponse): Record<string, unknown> {
  return JSON.parse(res.body) as Record<string, unknown>;
}
function assertError(res: LightMyRequestResponse, status: number, code: string) {
  assert.equal(res.statusCode, status, res.body);
  const body = json(res);
  assert.equal(body['code'], code, res.body);
  assert.equal(body['statusCode'], status);
  assert.equal(typeof body['message'], 'string');
}

before(async () => {
  f = await fixture({ traces: true });
  run = await syntheticRun({ log: f.log, serde: f.serde, traces: f.store! });
  f.runs.add({
    id: run.runId,
    config: { trainer: { lr: 1e-5 }, backend: { apiKey: 'sk-secret-value', url: 'http://x' } },
    consumerGroups: { reward: { groupId: 'reward-consumer', topics: [TOPICS.rolloutEvents] } },
  });
  for (let i = 0; i < 4; i++) await run.step();
  app = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: { pollTimeoutMs: 50 } });
  await app.ready();
  // The tail reads everything written so far before the tests look at it.
  for (let i = 0; i < 50 && (app.admin.tail?.get(run.runId)?.steps.length ?? 0) < 4; i++) await app.admin.tail!.waitForRecords(200);
});

after(async () => {
  await app.close();
  await run.stop();
  await f.close();
});

describe('health', () => {
  test('liveness and readiness need no token', async () => {
    assert.deepEqual(json(await app.inject({ url: '/healthz' })), { status: 'ok' });
    assert.deepEqual(json(await app.inject({ url: '/readyz' })), { status: 'ready', log: 'embedded', traces: 'chdb' });
  });
  test('readiness fails with 503 when the trace store does not answer', async () => {
    const broken = await buildAdminServer({ ...f.ctx, traces: { ...f.ctx.traces!, ping: async () => Promise.reject(new Error('down')) } }, { tokens: TOKENS, env: {}, tail: false });
    assertError(await broken.inject({ url: '/readyz' }), 503, 'ADM_ERR_NOT_READY');
    await broken.close();
  });
});

describe('runs', () => {
  test('list, one run, config with secrets redacted', async () => {
    const runs = json(await app.inject({ url: '/api/runs', headers: R }))['runs'] as { id: string; lastStep: number }[];
    assert.equal(runs.length, 1);
    assert.equal(runs[0]!.id, run.runId);
    assert.equal(runs[0]!.lastStep, 3);
    const one = json(await app.inject({ url: `/api/runs/${run.runId}`, headers: R }));
    assert.equal(one['status'], 'running');
    const cfg = json(await app.inject({ url: `/api/runs/${run.runId}/config`, headers: R }));
    assert.deepEqual(cfg['config'], { trainer: { lr: 1e-5 }, backend: { apiKey: '[redacted]', url: 'http://x' } });
  });
  test('unknown run is 404, malformed id is 400', async () => {
    assertError(await app.inject({ url: '/api/runs/nope', headers: R }), 404, 'ADM_ERR_NOT_FOUND');
    assertError(await app.inject({ url: '/api/runs/bad%20id', headers: R }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ url: '/api/runs/nope/config', headers: R }), 404, 'ADM_ERR_NOT_FOUND');
  });
});

describe('log', () => {
  test('topics with partition offsets', async () => {
    const topics = json(await app.inject({ url: '/api/topics', headers: R }))['topics'] as { name: string; partitions: number; records: number }[];
    const rollout = topics.find((t) => t.name === TOPICS.rolloutEvents)!;
    assert.equal(rollout.partitions, 4);
    assert.equal(rollout.records, 4 * 2 * 5); // 4 steps × 2 trajectories × 5 events
    const one = json(await app.inject({ url: `/api/topics/${TOPICS.trainSteps}`, headers: R }));
    // 4 steps and 3 evaluations (the warm start, v1, v2).
    assert.deepEqual(one['offsets'], [{ partition: 0, low: 0, high: 7, records: 7 }]);
  });
  test('unknown topic 404, invalid name 400', async () => {
    assertError(await app.inject({ url: '/api/topics/no.such.topic', headers: R }), 404, 'ADM_ERR_NOT_FOUND');
    assertError(await app.inject({ url: '/api/topics/bad$name', headers: R }), 400, 'ADM_ERR_VALIDATION');
  });
  test('consumer groups and lag per partition', async () => {
    const groups = json(await app.inject({ url: '/api/consumer-groups', headers: R }))['groups'] as { groupId: string; role: string }[];
    assert.deepEqual(groups.map((g) => [g.groupId, g.role]), [['reward-consumer', 'reward']]);
    // The group has committed nothing: its lag is everything in each partition.
    const lag = json(await app.inject({ url: '/api/consumer-groups/reward-consumer/lag', headers: R }));
    assert.equal(lag['total'], 40);
    assert.equal((lag['partitions'] as unknown[]).length, 4);
    // Commit part of it; the lag goes down by exactly that much.
    const c = await f.log.consumer({ groupId: 'reward-consumer', topics: [TOPICS.rolloutEvents] });
    const got = await c.poll({ maxRecords: 7, timeoutMs: 500 });
    await c.commit();
    await c.close();
    const lag2 = json(await app.inject({ url: `/api/consumer-groups/reward-consumer/lag?topic=${TOPICS.rolloutEvents}`, headers: R }));
    assert.equal(lag2['total'], 40 - got.length);
  });
  test('lag of an undeclared group needs ?topic=; bad topic 404', async () => {
    assertError(await app.inject({ url: '/api/consumer-groups/other/lag', headers: R }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ url: '/api/consumer-groups/other/lag?topic=nope', headers: R }), 404, 'ADM_ERR_NOT_FOUND');
    const ok = json(await app.inject({ url: `/api/consumer-groups/other/lag?topic=${TOPICS.trainSteps}`, headers: R }));
    assert.equal(ok['total'], 7);
  });
});

describe('training', () => {
  test('train steps with derived throughput and no held-out accuracy of their own; paging', async () => {
    const steps = json(await app.inject({ url: `/api/runs/${run.runId}/train-steps`, headers: R }))['steps'] as Record<string, unknown>[];
    assert.deepEqual(steps.map((s) => s['step']), [0, 1, 2, 3]);
    assert.equal(typeof steps[1]!['tokens_per_s'], 'number');
    // Step 2 produced no version and nothing evaluated it: it has no accuracy, not the last one carried forward.
    assert.ok(steps.every((s) => !('heldout_accuracy' in s)));
    assert.equal('trajectory_ids' in steps[0]!, false, 'the id lists stay out of the API');
    const after1 = json(await app.inject({ url: `/api/runs/${run.runId}/train-steps?after=1&limit=1`, headers: R }))['steps'] as { step: number }[];
    assert.deepEqual(after1.map((s) => s.step), [3]);
  });
  test('evaluations: each at its version and the step that produced it; share solved and mean reward apart', async () => {
    const evals = json(await app.inject({ url: `/api/runs/${run.runId}/evaluations`, headers: R }))['evaluations'] as Record<string, unknown>[];
    assert.deepEqual(evals.map((e) => [e['phase'], e['policy_version'], e['step']]), [
      ['initial', 0, 0],
      // v1's event left its step out: the version's PolicyVersion says step 1.
      ['periodic', 1, 1],
      ['periodic', 2, 3],
    ]);
    for (const [i, e] of evals.entries()) {
      const w = run.evaluations[i]!;
      assert.equal(e['accuracy'], w.solved / w.n, 'accuracy is the share solved');
      assert.equal(e['mean_reward'], w.mean_reward);
      assert.notEqual(e['accuracy'], e['mean_reward'], 'partial credit shows in the mean reward, not in the accuracy');
      assert.equal(e['problem_set'], 'synthetic/heldout[0:20]');
    }
    const live = json(await app.inject({ url: `/api/runs/${run.runId}/live?after=2`, headers: R }));
    assert.deepEqual(live['evaluations'], evals, 'live carries every evaluation whatever steps it pages');
  });
  test('policy versions', async () => {
    const versions = json(await app.inject({ url: `/api/runs/${run.runId}/policy-versions`, headers: R }))['versions'] as { policy_version: number; parent: number }[];
    assert.deepEqual(versions.map((v) => v.policy_version), [1, 2]);
    assert.equal(versions[1]!.parent, 1);
  });
  test('live: run, steps after N, rollout lag per partition of the declared group', async () => {
    const live = json(await app.inject({ url: `/api/runs/${run.runId}/live?after=2`, headers: R }));
    assert.deepEqual((live['steps'] as { step: number }[]).map((s) => s.step), [3]);
    const lag = live['rolloutLag'] as { groupId: string; partition: number }[];
    assert.deepEqual(lag.map((l) => l.partition).sort(), [0, 1, 2, 3]);
    assert.ok(lag.every((l) => l.groupId === 'reward-consumer'));
    assert.equal(live['rolloutLagNote'], null);
  });
  test('live: a run known only from the log shows the lag of its own groups that read, never partition sizes', async () => {
    const other = await syntheticRun({ log: f.log, serde: f.serde, runId: 'found-in-log' });
    await other.step();
    await other.stop();
    for (let i = 0; i < 50 && !app.admin.tail?.get('found-in-log'); i++) await app.admin.tail!.waitForRecords(200);
    const none = json(await app.inject({ url: '/api/runs/found-in-log/live', headers: R }));
    assert.deepEqual(none['rolloutLag'], []);
    assert.match(none['rolloutLagNote'] as string, /no consumer group of run found-in-log has read rollout\.events/);
    // Its reward role's group (named as the main job names it) reads part of the topic: that is the lag shown.
    const c = await f.log.consumer({ groupId: 'found-in-log.reward', topics: [TOPICS.rolloutEvents] });
    const got = await c.poll({ maxRecords: 5, timeoutMs: 500 });
    await c.commit();
    await c.close();
    const live = json(await app.inject({ url: '/api/runs/found-in-log/live', headers: R }));
    const lag = live['rolloutLag'] as { groupId: string; lag: number; high: number }[];
    assert.ok(lag.length > 0 && lag.every((l) => l.groupId === 'found-in-log.reward'));
    const total = lag.reduce((n, l) => n + l.high, 0);
    assert.equal(lag.reduce((n, l) => n + l.lag, 0), total - got.length, 'what the group has not read');
    assert.equal(live['rolloutLagNote'], null);
  });
  test('bad paging is 400, unknown run 404', async () => {
    assertError(await app.inject({ url: `/api/runs/${run.runId}/train-steps?limit=0`, headers: R }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ url: `/api/runs/${run.runId}/train-steps?after=abc`, headers: R }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ url: `/api/runs/${run.runId}/policy-versions?limit=99999`, headers: R }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ url: '/api/runs/ghost/live', headers: R }), 404, 'ADM_ERR_NOT_FOUND');
  });
});

describe('control', () => {
  test('pause, staleness, resume, stop are published as Control events and change the run view', async () => {
    const pause = await app.inject({ method: 'POST', url: `/api/runs/${run.runId}/control/pause`, headers: C, payload: { reason: 'maintenance' } });
    assert.equal(pause.statusCode, 202, pause.body);
    assert.equal(json(pause)['command'], 'pause');
    const st = await app.inject({ method: 'POST', url: `/api/runs/${run.runId}/control/staleness`, headers: C, payload: { bound: 3 } });
    assert.equal(st.statusCode, 202, st.body);
    // The events are on the control topic, decodable, with the operator's name (never the token).
    const c = await f.log.consumer({ groupId: 'test-control-reader', topics: [TOPICS.control] });
    const recs = await c.poll({ timeoutMs: 1000 });
    await c.close();
    const events = await Promise.all(recs.map((r) => f.serde.decode(r.value)));
    assert.deepEqual(events.map((e) => e.name === 'Control' && [e.value.command, e.value.staleness_bound, e.value.issued_by]), [
      ['pause', null, 'admin:operator'],
      ['set_staleness', 3, 'admin:operator'],
    ]);
    assert.ok(recs.every((r) => r.key?.toString() === run.runId));
    // The tail sees them: the run shows paused with bound 3.
    for (let i = 0; i < 20; i++) {
      const r = json(await app.inject({ url: `/api/runs/${run.runId}`, headers: R }));
      if (r['status'] === 'paused' && r['stalenessBound'] === 3) break;
      await app.admin.tail!.waitForRecords(200);
    }
    const r = json(await app.inject({ url: `/api/runs/${run.runId}`, headers: R }));
    assert.equal(r['status'], 'paused');
    assert.equal(r['stalenessBound'], 3);
    assert.equal((await app.inject({ method: 'POST', url: `/api/runs/${run.runId}/control/resume`, headers: C, payload: {} })).statusCode, 202);
  });
  test('invalid control input is 400; unknown run 404; finished run 409', async () => {
    const url = `/api/runs/${run.runId}/control/staleness`;
    assertError(await app.inject({ method: 'POST', url, headers: C, payload: { bound: -1 } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url, headers: C, payload: { bound: 'x' } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url, headers: C, payload: {} }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: `/api/runs/${run.runId}/control/pause`, headers: C, payload: { extra: 1 } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: `/api/runs/${run.runId}/control/pause`, headers: { ...C, 'content-type': 'application/json' }, payload: '{"reason":' }), 400, 'ADM_ERR_BAD_JSON');
    assertError(await app.inject({ method: 'POST', url: `/api/runs/${run.runId}/control/pause`, headers: { ...C, 'content-type': 'text/xml' }, payload: '<x/>' }), 415, 'ADM_ERR_UNSUPPORTED_MEDIA_TYPE');
    assertError(await app.inject({ method: 'POST', url: '/api/runs/ghost/control/stop', headers: C, payload: {} }), 404, 'ADM_ERR_NOT_FOUND');
    f.runs.add({ id: 'done-run', status: 'completed' });
    assertError(await app.inject({ method: 'POST', url: '/api/runs/done-run/control/resume', headers: C, payload: {} }), 409, 'ADM_ERR_CONFLICT');
  });
  test('a body over the limit is 413', async () => {
    assertError(
      await app.inject({ method: 'POST', url: `/api/runs/${run.runId}/control/pause`, headers: C, payload: { reason: 'x'.repeat(70_000) } }),
      413,
      'ADM_ERR_BODY_TOO_LARGE',
    );
  });
});

describe('traces', () => {
  test('read-only SQL returns rows and the limits applied', async () => {
    const res = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT count() AS n FROM tool_calls FINAL', maxRows: 10 } });
    assert.equal(res.statusCode, 200, res.body);
    const body = json(res);
    assert.equal(Number((body['rows'] as { n: unknown }[])[0]!.n), 8);
    assert.deepEqual(body['limits'], { maxRows: 10, maxBytes: 16 * 1024 * 1024, timeoutMs: 10_000 });
  });
  test('SQL input errors are 4xx: empty, too long a limit, unknown table, syntax, row limit', async () => {
    assertError(await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: '' } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT 1', maxRows: 10_000_000 } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT * FROM no_such_table' } }), 400, 'ADM_ERR_SQL_INVALID');
    assertError(await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELEC 1' } }), 400, 'ADM_ERR_SQL_INVALID');
    assertError(await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT number FROM system.numbers LIMIT 100', maxRows: 5 } }), 422, 'ADM_ERR_SQL_LIMIT');
  });
  test('named queries: list, run with parameters, bad parameters 400, unknown name 404', async () => {
    const list = json(await app.inject({ url: '/api/traces/queries', headers: R }))['queries'] as { name: string; params: { name: string }[] }[];
    const stats = list.find((q) => q.name === 'tool_stats');
    assert.ok(stats, list.map((q) => q.name).join(' '));
    const res = await app.inject({ method: 'POST', url: '/api/traces/queries/tool_stats', headers: R, payload: { params: { run: run.runId } } });
    assert.equal(res.statusCode, 200, res.body);
    const rows = json(res)['rows'] as { tool_name: string; calls: unknown }[];
    assert.equal(rows[0]!.tool_name, 'calculator');
    assert.equal(Number(rows[0]!.calls), 8);
    assertError(await app.inject({ method: 'POST', url: '/api/traces/queries/tool_stats', headers: R, payload: { params: { nope: 1 } } }), 400, 'ADM_ERR_QUERY_PARAMS');
    assertError(await app.inject({ method: 'POST', url: '/api/traces/queries/tool_stats', headers: R, payload: { params: { run: { x: 1 } } } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: '/api/traces/queries/no_such_query', headers: R, payload: {} }), 404, 'ADM_ERR_QUERY_UNKNOWN');
    assertError(await app.inject({ method: 'POST', url: '/api/traces/queries/bad-name!', headers: R, payload: {} }), 400, 'ADM_ERR_VALIDATION');
  });
  test('tool calls, newest first, filtered by run and status', async () => {
    const calls = json(await app.inject({ url: `/api/tool-calls?runId=${run.runId}&limit=3`, headers: R }))['toolCalls'] as { toolName: string; time: number }[];
    assert.equal(calls.length, 3);
    assert.ok(calls.every((c) => c.toolName === 'calculator'));
    assert.ok(calls[0]!.time >= calls[2]!.time);
    assertError(await app.inject({ url: '/api/tool-calls?status=exploded', headers: R }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ url: '/api/tool-calls?limit=0', headers: R }), 400, 'ADM_ERR_VALIDATION');
  });
  test('trace routes answer 503 where the process has no trace store', async () => {
    const bare = await buildAdminServer({ ...f.ctx, traces: null }, { tokens: TOKENS, env: {}, tail: false });
    assertError(await bare.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT 1' } }), 503, 'ADM_ERR_UNAVAILABLE');
    assertError(await bare.inject({ url: '/api/trajectories/abc', headers: R }), 503, 'ADM_ERR_UNAVAILABLE');
    await bare.close();
  });
});

describe('trajectories', () => {
  test('a trajectory with turns, tokens, masks and its tool call', async () => {
    const id = run.trajectoryIds[1]!;
    const res = await app.inject({ url: `/api/trajectories/${id}`, headers: R });
    assert.equal(res.statusCode, 200, res.body);
    const t = json(res) as { turns: { role: string; tokenIds: number[]; responseMask: number[]; logprobs: number[] }[]; toolCalls: { toolName: string; resultText: string }[]; reward: number; termination: string };
    assert.deepEqual(t.turns.map((u) => u.role), ['assistant', 'tool', 'assistant']);
    for (const u of t.turns) {
      assert.equal(u.responseMask.length, u.tokenIds.length);
      assert.ok(u.responseMask.every((m) => m === (u.role === 'assistant' ? 1 : 0)));
    }
    assert.equal(t.toolCalls[0]!.toolName, 'calculator');
    assert.equal(t.toolCalls[0]!.resultText, '15'); // sample 1 of step 0: 3 * 5
    assert.equal(t.reward, 1);
    assert.equal(t.termination, 'stop');
    // Step 0 trained on it (its trajectory_ids name it).
    assert.deepEqual([json(res)['split'], json(res)['training']], ['train', { outcome: 'trained', step: 0 }]);
  });
  test('a held-out trajectory is never reported trained; one a step dropped as stale says so', async () => {
    const t = Date.now();
    const start = (id: string, split: string) => ({
      run_id: run.runId, trajectory_id: id, group_id: `g-${id}`, sample_index: 0, group_size: 1, agent_name: 'tool_agent', data_source: 'calculator',
      dataset_name: 'synthetic', split, dataset_index: 0, prompt_roles: ['user'], prompt_contents: ['2+2?'], prompt_token_ids: [50], tool_names: [], tools_json: '[]',
      sampling_json: '{}', policy_version: 3, ground_truth: '4', extra_info_json: '{}', event_id: `s-${id}`, time: t, _version: t,
    });
    await f.store!.insert('trajectory_starts', [start('heldout-1', 'heldout'), start('stale-1', 'train')]);
    const step = run.evaluations.length; // any step number the synthetic run has not written
    const ts = { event_id: 'ts-stale', time_ms: t, run_id: run.runId, step: 100 + step, policy_version: 3, produced_version: null, trajectories: 0, tokens: 0, trajectory_ids: [], loss: 0, pg_loss: 0, kl: 0, entropy: 0, clip_fraction: 0, approx_kl: 0, grad_norm: 0, learning_rate: 0, reward_mean: 0, staleness_mean: 0, staleness_max: 0, iw_mean: 1, iw_max: 1, iw_truncated_fraction: 0, dropped_stale: 1, wait_ms: 0, compute_ms: 0, metrics: [], dropped_trajectory_ids: ['stale-1'] };
    for (const r of rowsOf({ name: 'TrainStep', value: ts, schemaId: 0 })) await f.store!.insert(r.table, [r.row]);
    const heldout = json(await app.inject({ url: '/api/trajectories/heldout-1', headers: R }));
    assert.deepEqual([heldout['split'], heldout['training']], ['heldout', null]);
    const stale = json(await app.inject({ url: '/api/trajectories/stale-1', headers: R }));
    assert.deepEqual([stale['split'], stale['training']], ['train', { outcome: 'dropped', step: 100 + step }]);
  });
  test('unknown id 404, malformed id 400', async () => {
    assertError(await app.inject({ url: '/api/trajectories/0000', headers: R }), 404, 'ADM_ERR_NOT_FOUND');
    assertError(await app.inject({ url: "/api/trajectories/x'%20OR%201=1", headers: R }), 400, 'ADM_ERR_VALIDATION');
  });
});

describe('replay jobs', () => {
  test('start a traces rebuild, watch its progress to completion, list, cancel', async () => {
    const start = await app.inject({ method: 'POST', url: '/api/replay-jobs', headers: C, payload: { target: 'traces', runId: run.runId } });
    assert.equal(start.statusCode, 202, start.body);
    const job = json(start) as { id: string; state: string };
    assert.ok(['pending', 'running'].includes(job.state));
    let p: { state: string; processed: number; total: number | null } = { state: job.state, processed: 0, total: null };
    for (let i = 0; i < 100 && !['completed', 'failed'].includes(p.state); i++) {
      await new Promise((r) => setTimeout(r, 100));
      p = json(await app.inject({ url: `/api/replay-jobs/${job.id}`, headers: R })) as typeof p;
    }
    assert.equal(p.state, 'completed', JSON.stringify(p));
    assert.ok(p.total !== null && p.total > 0 && p.processed === p.total, JSON.stringify(p));
    assert.equal((json(await app.inject({ url: '/api/replay-jobs', headers: R }))['jobs'] as unknown[]).length, 1);
    // Cancelling a finished job returns it unchanged.
    const cancel = await app.inject({ method: 'POST', url: `/api/replay-jobs/${job.id}/cancel`, headers: C });
    assert.equal(json(cancel)['state'], 'completed');
  });
  test('invalid specs 400, unknown job 404, no replay manager 503', async () => {
    assertError(await app.inject({ method: 'POST', url: '/api/replay-jobs', headers: C, payload: {} }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: '/api/replay-jobs', headers: C, payload: { target: 'Reward!' } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: '/api/replay-jobs', headers: C, payload: { target: 'nowhere' } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ method: 'POST', url: '/api/replay-jobs', headers: C, payload: { target: 'reward', fromMs: 10, toMs: 5 } }), 400, 'ADM_ERR_VALIDATION');
    assertError(await app.inject({ url: '/api/replay-jobs/nope', headers: R }), 404, 'ADM_ERR_NOT_FOUND');
    assertError(await app.inject({ method: 'POST', url: '/api/replay-jobs/nope/cancel', headers: C }), 404, 'ADM_ERR_NOT_FOUND');
    const bare = await buildAdminServer({ ...f.ctx, replay: null }, { tokens: TOKENS, env: {}, tail: false });
    assertError(await bare.inject({ url: '/api/replay-jobs', headers: R }), 503, 'ADM_ERR_UNAVAILABLE');
    await bare.close();
  });
});

describe('metrics, static pages, unknown routes', () => {
  test('/metrics is Prometheus text with the admin request counters', async () => {
    const res = await app.inject({ url: '/metrics', headers: R });
    assert.equal(res.statusCode, 200);
    assert.match(String(res.headers['content-type']), /^text\/plain/);
    assert.match(res.body, /rlstream_admin_requests_total\{method="GET",route="\/api\/runs",status="200"\} \d+/);
  });
  test('dashboard files are served with a strict CSP; unknown files 404', async () => {
    const page = await app.inject({ url: '/dashboard/' });
    assert.equal(page.statusCode, 200);
    assert.match(String(page.headers['content-security-policy']), /default-src 'self'/);
    assert.equal((await app.inject({ url: '/dashboard/app.js' })).statusCode, 200);
    assertError(await app.inject({ url: '/dashboard/secret.js' }), 404, 'ADM_ERR_NOT_FOUND');
    assertError(await app.inject({ url: '/dashboard/..%2fserver.ts' }), 400, 'ADM_ERR_VALIDATION');
    assert.equal((await app.inject({ url: '/' })).statusCode, 302);
  });
  test('unknown routes are 404 with a code (after authentication)', async () => {
    assertError(await app.inject({ url: '/api/nothing', headers: R }), 404, 'ADM_ERR_ROUTE_NOT_FOUND');
    assertError(await app.inject({ url: '/api/nothing' }), 401, 'ADM_ERR_UNAUTHENTICATED');
  });
});
