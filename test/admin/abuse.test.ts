// The admin API under abuse, on a real embedded log and chDB store: slow user queries never hold readiness or
// the tool-call feed and overflow the bounded query pool as 429s; replay jobs are capped; every answer carries
// the nosniff and frame headers; a trickled request is cut at the request timeout; and the served OpenAPI
// document and the behaviour agree where a fuzzer found them apart (414, a boolean for a string, an omitted
// optional field, unknown methods, empty control bodies, the favicon).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { buildAdminServer, startAdminServer } from '../../admin/server.ts';
import type { ReplayJobInfo, ReplayManager, ReplaySpec } from '../../admin/context.ts';
import { auth, CONTROL_TOKEN, fixture, READ_TOKEN, TOKENS, type Fixture } from './helpers.ts';

const R = auth(READ_TOKEN);
const C = auth(CONTROL_TOKEN);
/** About 3 s on the engine (sleepEachRow sleeps at most 3 s a block). */
const SLOW = 'SELECT sum(sleepEachRow(0.5)) AS s FROM numbers(6)';

let f: Fixture;
let app: FastifyInstance;
before(async () => {
  f = await fixture({ traces: true });
  f.runs.add({ id: 'run-a' });
  app = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false, queryPool: { running: 2, queued: 1 } });
});
after(async () => {
  await app.close();
  await f.close();
});

describe('slow queries', () => {
  test('readiness and the tool-call feed answer while user queries run; a full pool is 429', async () => {
    const finished: number[] = [];
    const slow = [0, 1, 2].map(() => app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: SLOW } }).then((res) => (finished.push(Date.now()), res)));
    await new Promise((r) => setTimeout(r, 200));
    const t0 = Date.now();
    const ready = await app.inject({ url: '/readyz' });
    const feed = await app.inject({ url: '/api/tool-calls', headers: R });
    const waited = Date.now() - t0;
    assert.equal(ready.statusCode, 200, ready.body);
    assert.equal(feed.statusCode, 200, feed.body);
    assert.ok(waited < 1500, `readiness and the feed took ${waited} ms behind three ~3 s queries`);
    // Two run and one waits: the next is refused at once instead of queueing behind them.
    const t1 = Date.now();
    const over = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT 1 AS one' } });
    assert.equal(over.statusCode, 429, over.body);
    assert.equal(JSON.parse(over.body).code, 'ADM_ERR_BUSY');
    assert.ok(Date.now() - t1 < 1000);
    const done = await Promise.all(slow);
    assert.deepEqual(done.map((d) => d.statusCode), [200, 200, 200], done.map((d) => d.body).join('\n'));
    // Two ran at once (they end together, ~3 s before the third), not one after the other.
    finished.sort((a, b) => a - b);
    assert.ok(finished[1]! - finished[0]! < 1500, `the first two ended ${finished[1]! - finished[0]!} ms apart`);
    assert.equal((await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT 1 AS one' } })).statusCode, 200);
  });
});

describe('replay jobs', () => {
  test('at most maxReplayJobs pending or running; another start is 429', async () => {
    // A manager whose jobs stay running until cancelled, so that the route's cap is what is measured.
    const jobs: ReplayJobInfo[] = [];
    const manager: ReplayManager = {
      async start(spec: ReplaySpec) {
        const job: ReplayJobInfo = { id: `job-${jobs.length}`, spec, state: 'running', startedMs: Date.now(), finishedMs: null, processed: 0, total: null, error: null };
        jobs.push(job);
        return job;
      },
      list: () => jobs,
      get: (id) => jobs.find((j) => j.id === id),
      async cancel(id) {
        const j = jobs.find((x) => x.id === id);
        if (j) j.state = 'cancelled';
        return j;
      },
    };
    const capped = await buildAdminServer({ ...f.ctx, replay: manager }, { tokens: TOKENS, env: {}, tail: false, maxReplayJobs: 2 });
    try {
      const start = () => capped.inject({ method: 'POST', url: '/api/replay-jobs', headers: C, payload: { target: 'reward' } });
      assert.deepEqual([(await start()).statusCode, (await start()).statusCode], [202, 202]);
      const third = await start();
      assert.equal(third.statusCode, 429, third.body);
      assert.equal(JSON.parse(third.body).code, 'ADM_ERR_BUSY');
      assert.equal((await capped.inject({ method: 'POST', url: '/api/replay-jobs/job-0/cancel', headers: C })).statusCode, 200);
      assert.equal((await start()).statusCode, 202, 'a cancelled job frees its place');
    } finally {
      await capped.close();
    }
  });
});

describe('headers and timeouts', () => {
  test('nosniff and DENY on every answer, errors and pages included', async () => {
    for (const req of [{ url: '/healthz' }, { url: '/api/runs', headers: R }, { url: '/api/runs' }, { url: '/api/nothing', headers: R }, { url: '/dashboard/' }, { url: `/api/runs/${'x'.repeat(300)}`, headers: R }]) {
      const res = await app.inject(req);
      assert.equal(res.headers['x-content-type-options'], 'nosniff', `${req.url} ${res.statusCode}`);
      assert.equal(res.headers['x-frame-options'], 'DENY', `${req.url} ${res.statusCode}`);
    }
  });

  test('a request whose body trickles in is cut at the request timeout', { timeout: 20_000 }, async () => {
    const server = await startAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false, requestTimeoutMs: 1000 });
    try {
      const { port } = new URL(server.url);
      const socket = connect(Number(port), '127.0.0.1');
      const t0 = Date.now();
      let answer = '';
      socket.on('data', (d) => (answer += d.toString()));
      const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
      socket.write(`POST /api/traces/sql HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${READ_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{`);
      const trickle = setInterval(() => socket.writable && socket.write(' '), 200);
      await closed;
      clearInterval(trickle);
      const took = Date.now() - t0;
      assert.ok(took < 5000, `the connection stayed open ${took} ms`);
      assert.match(answer, /^HTTP\/1\.1 408/, answer.slice(0, 100));
    } finally {
      await server.close();
    }
  });
});

describe('the OpenAPI document and the behaviour agree', () => {
  let doc: { paths: Record<string, Record<string, { parameters?: { name: string; required?: boolean }[]; requestBody?: { required?: boolean } }>> };
  before(async () => {
    doc = JSON.parse((await app.inject({ url: '/openapi.json' })).body) as typeof doc;
  });

  test('an over-long path parameter is a 414 in the catalogue shape', async () => {
    const res = await app.inject({ url: `/api/runs/${'a'.repeat(300)}`, headers: R });
    assert.equal(res.statusCode, 414);
    assert.equal(JSON.parse(res.body).code, 'ADM_ERR_URI_TOO_LONG');
    // Up to the 200 characters the schema allows, a run id is looked up, not cut off.
    const ok = await app.inject({ url: `/api/runs/${'a'.repeat(200)}`, headers: R });
    assert.equal(JSON.parse(ok.body).code, 'ADM_ERR_NOT_FOUND');
  });

  test('bodies are not coerced: a boolean where a string is declared is a 400', async () => {
    const res = await app.inject({ method: 'POST', url: '/api/runs/run-a/control/pause', headers: C, payload: { reason: true } });
    assert.equal(res.statusCode, 400, res.body);
    assert.equal(JSON.parse(res.body).code, 'ADM_ERR_VALIDATION');
    const sql = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: R, payload: { sql: 'SELECT 1', maxRows: '10' } });
    assert.equal(sql.statusCode, 400, sql.body);
    // Query strings are text and are still read as their declared types.
    assert.equal((await app.inject({ url: '/api/tool-calls?limit=5', headers: R })).statusCode, 200);
  });

  test('limit of the tool-call feed is optional, as documented', async () => {
    const limit = doc.paths['/api/tool-calls']!['get']!.parameters!.find((p) => p.name === 'limit');
    assert.equal(limit?.required, false);
    assert.equal((await app.inject({ url: '/api/tool-calls', headers: R })).statusCode, 200);
  });

  test('control commands take no body, or an empty one', async () => {
    for (const cmd of ['pause', 'resume', 'stop']) assert.equal(doc.paths[`/api/runs/{runId}/control/${cmd}`]!['post']!.requestBody?.required, false, cmd);
    const none = await app.inject({ method: 'POST', url: '/api/runs/run-a/control/pause', headers: C });
    assert.equal(none.statusCode, 202, none.body);
    const empty = await app.inject({ method: 'POST', url: '/api/runs/run-a/control/resume', headers: { ...C, 'content-type': 'application/json' }, payload: '' });
    assert.equal(empty.statusCode, 202, empty.body);
    // A command with a required field names it.
    const bound = await app.inject({ method: 'POST', url: '/api/runs/run-a/control/staleness', headers: C });
    assert.equal(bound.statusCode, 400);
    assert.match(JSON.parse(bound.body).message, /bound/);
  });

  test('an unknown method on a known path is 405 with Allow', async () => {
    for (const [method, url, allow] of [
      ['PUT', '/api/runs', 'GET, HEAD'],
      ['DELETE', '/api/runs/run-a/control/pause', 'POST'],
      ['PATCH', '/healthz', 'GET, HEAD'],
    ] as const) {
      const res = await app.inject({ method, url, headers: R });
      assert.equal(res.statusCode, 405, `${method} ${url}: ${res.body}`);
      assert.equal(JSON.parse(res.body).code, 'ADM_ERR_METHOD_NOT_ALLOWED');
      assert.equal(res.headers['allow'], allow);
    }
    assert.equal((await app.inject({ url: '/api/nothing', headers: R })).statusCode, 404);
  });

  test('/favicon.ico is a 404 without a token', async () => {
    const res = await app.inject({ url: '/favicon.ico' });
    assert.equal(res.statusCode, 404);
    assert.equal(JSON.parse(res.body).code, 'ADM_ERR_NOT_FOUND');
  });
});
