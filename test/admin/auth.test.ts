// Authentication and roles: every route but health, readiness and static pages needs a token; every mutating
// route needs the control role (no token → 401, wrong token → 401, read token → 403); tokens come from options
// and RLSTREAM_ADMIN_TOKENS, are kept hashed, and never reach a log line. Also rate limits and CORS.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { bearerToken, parseTokenList, TokenStore } from '../../core/auth/tokens.ts';
import { buildAdminServer } from '../../admin/server.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { auth, CONTROL_TOKEN, fixture, READ_TOKEN, TOKENS, type Fixture } from './helpers.ts';
import { syntheticRun } from './synthetic-run.ts';

const lines: string[] = [];
let f: Fixture;
let app: FastifyInstance;
let runId: string;
const WRONG = 'wrong-token-aaaaaaaaaaaaaaaa';

interface Route {
  method: string;
  url: string;
}

/** Every documented operation, with path parameters filled in (from the OpenAPI document, so none is missed). */
async function documentedRoutes(): Promise<(Route & { security: boolean })[]> {
  const doc = JSON.parse((await app.inject({ url: '/openapi.json' })).body) as { paths: Record<string, Record<string, { security?: unknown[] }>> };
  const out: (Route & { security: boolean })[] = [];
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const url = path.replace('{runId}', runId).replace(/\{[A-Za-z]+\}/g, 'x');
      out.push({ method: method.toUpperCase(), url, security: Array.isArray(op.security) && op.security.length > 0 });
    }
  }
  return out;
}

before(async () => {
  f = await fixture({ logger: jsonLogger({ level: 'debug', write: (l) => lines.push(l) }) });
  const run = await syntheticRun({ log: f.log, serde: f.serde });
  runId = run.runId;
  f.runs.add({ id: runId });
  await run.stop();
  // These tests send many requests without a valid token on purpose; the failure limit has a test of its own.
  app = await buildAdminServer(f.ctx, { tokens: TOKENS, env: { RLSTREAM_ADMIN_TOKENS: 'control:env-control-token-123456' }, tail: false, authFailureLimit: false });
  await app.ready();
});

after(async () => {
  await app.close();
  await f.close();
});

describe('token store', () => {
  test('verifies by digest, distinguishes roles, rejects near misses', () => {
    const s = new TokenStore(TOKENS);
    assert.deepEqual(s.verify(READ_TOKEN), { role: 'read', name: 'reader' });
    assert.deepEqual(s.verify(CONTROL_TOKEN), { role: 'control', name: 'operator' });
    assert.equal(s.verify(READ_TOKEN.slice(0, -1)), null);
    assert.equal(s.verify(READ_TOKEN + 'x'), null);
    assert.equal(s.verify(''), null);
    // Only digests are held: the token text is nowhere in the object.
    assert.equal(JSON.stringify(s).includes(READ_TOKEN), false);
  });
  test('short tokens and unknown roles are configuration errors', () => {
    assert.throws(() => new TokenStore([{ token: 'short', role: 'read' }]), (e) => isRlstreamError(e, 'CONFIG_INVALID') && /shorter than 16/.test(e.message));
    assert.throws(() => new TokenStore([{ token: 'x'.repeat(20), role: 'admin' as 'read' }]), (e) => isRlstreamError(e, 'CONFIG_INVALID'));
  });
  test('RLSTREAM_ADMIN_TOKENS: role:token entries, bare tokens are read tokens', () => {
    assert.deepEqual(parseTokenList(' control:abc , def ,,read:ghi'), [
      { token: 'abc', role: 'control', name: 'control#1' },
      { token: 'def', role: 'read', name: 'read#2' },
      { token: 'ghi', role: 'read', name: 'read#3' },
    ]);
    assert.throws(() => parseTokenList('root:abc'), (e) => isRlstreamError(e, 'CONFIG_INVALID'));
  });
  test('bearer header parsing', () => {
    assert.equal(bearerToken('Bearer abc'), 'abc');
    assert.equal(bearerToken('bearer  abc '), 'abc');
    assert.equal(bearerToken('Basic abc'), null);
    assert.equal(bearerToken('Bearer a b'), null);
    assert.equal(bearerToken(undefined), null);
  });
});

describe('routes', () => {
  test('every documented route except health and readiness requires a token', async () => {
    const routes = await documentedRoutes();
    assert.ok(routes.length >= 20);
    for (const r of routes) {
      const isPublic = r.url === '/healthz' || r.url === '/readyz';
      assert.equal(r.security, !isPublic, `${r.method} ${r.url} documents its security`);
      if (isPublic) continue;
      for (const headers of [{}, auth(WRONG), { authorization: `Basic ${READ_TOKEN}` }]) {
        const res = await app.inject({ method: r.method as 'GET', url: r.url, headers, payload: r.method === 'POST' ? {} : undefined });
        assert.equal(res.statusCode, 401, `${r.method} ${r.url} without a valid token: ${res.body}`);
        assert.equal(JSON.parse(res.body).code, 'ADM_ERR_UNAUTHENTICATED');
      }
    }
  });

  test('the only public routes are health, readiness, the dashboard files and the API description', () => {
    const open = app.admin.routes.filter((r) => r.access === 'public').map((r) => r.url);
    assert.ok(open.every((u) => ['/healthz', '/readyz', '/', '/openapi.json', '/favicon.ico'].includes(u) || u.startsWith('/dashboard/') || u.startsWith('/docs')), open.join(' '));
    assert.ok(app.admin.routes.filter((r) => r.method !== 'GET').every((r) => r.access === 'control' || r.url.startsWith('/api/traces/')));
  });

  test('every mutating route: no token 401, wrong token 401, read token 403, control token passes', async () => {
    const mutating = (await documentedRoutes()).filter((r) => r.method !== 'GET' && !r.url.startsWith('/api/traces/'));
    assert.deepEqual(mutating.map((r) => r.url).sort(), [
      `/api/replay-jobs`,
      `/api/replay-jobs/x/cancel`,
      `/api/runs/${runId}/control/pause`,
      `/api/runs/${runId}/control/resume`,
      `/api/runs/${runId}/control/staleness`,
      `/api/runs/${runId}/control/stop`,
    ]);
    for (const r of mutating) {
      const call = (headers: Record<string, string>) => app.inject({ method: 'POST', url: r.url, headers, payload: r.url.endsWith('staleness') ? { bound: 2 } : r.url === '/api/replay-jobs' ? { target: 'traces' } : {} });
      assert.equal((await call({})).statusCode, 401, r.url);
      assert.equal((await call(auth(WRONG))).statusCode, 401, r.url);
      const ro = await call(auth(READ_TOKEN));
      assert.equal(ro.statusCode, 403, r.url);
      assert.equal(JSON.parse(ro.body).code, 'ADM_ERR_FORBIDDEN');
      const ok = await call(auth(CONTROL_TOKEN));
      assert.ok(ok.statusCode !== 401 && ok.statusCode !== 403, `${r.url} with a control token: ${ok.body}`);
    }
    // The stop issued above is in the log; the env token works as a control token too.
    const envTok = await app.inject({ method: 'POST', url: `/api/runs/${runId}/control/resume`, headers: auth('env-control-token-123456'), payload: {} });
    assert.equal(envTok.statusCode, 202);
  });

  test('read routes accept read and control tokens', async () => {
    for (const t of [READ_TOKEN, CONTROL_TOKEN]) assert.equal((await app.inject({ url: '/api/runs', headers: auth(t) })).statusCode, 200);
  });

  test('no token, good or bad, ever reaches a log line', async () => {
    await app.inject({ url: `/api/runs?token=${READ_TOKEN}`, headers: auth(READ_TOKEN) });
    await app.inject({ url: '/api/nothing', headers: auth(WRONG) });
    await app.inject({ method: 'POST', url: `/api/runs/${runId}/control/pause`, headers: auth(CONTROL_TOKEN), payload: {} });
    assert.ok(lines.length > 5, 'requests were logged');
    const all = lines.join('\n');
    for (const t of [READ_TOKEN, CONTROL_TOKEN, WRONG, 'env-control-token-123456']) assert.equal(all.includes(t), false, `token ${t.slice(0, 8)}… in logs`);
    assert.match(all, /"by":"operator"/);
  });
});

describe('limits and CORS', () => {
  test('rate limit answers 429 with a code', async () => {
    const limited = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false, rateLimit: { max: 3, timeWindowMs: 60_000 } });
    const codes = [];
    for (let i = 0; i < 5; i++) codes.push((await limited.inject({ url: '/api/runs', headers: auth(READ_TOKEN) })).statusCode);
    assert.deepEqual(codes, [200, 200, 200, 429, 429]);
    const body = JSON.parse((await limited.inject({ url: '/api/runs', headers: auth(READ_TOKEN) })).body);
    assert.equal(body.code, 'ADM_ERR_RATE_LIMITED');
    // Health is never rate limited (probes must not be starved by a busy client).
    assert.equal((await limited.inject({ url: '/healthz' })).statusCode, 200);
    await limited.close();
  });
  test('failed authentications are limited per client before the token is checked', async () => {
    const limited = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false, authFailureLimit: { max: 5, timeWindowMs: 60_000 } });
    const codes: number[] = [];
    for (let i = 0; i < 8; i++) codes.push((await limited.inject({ url: '/api/runs', headers: auth(`${WRONG}${i}`) })).statusCode);
    assert.deepEqual(codes, [401, 401, 401, 401, 401, 429, 429, 429]);
    // Once over the limit even the right token waits: the check comes before the token is looked at.
    const blocked = await limited.inject({ url: '/api/runs', headers: auth(READ_TOKEN) });
    assert.equal(blocked.statusCode, 429);
    assert.equal(JSON.parse(blocked.body).code, 'ADM_ERR_RATE_LIMITED');
    // Another client address is not affected, and public routes never are.
    assert.equal((await limited.inject({ url: '/api/runs', headers: auth(READ_TOKEN), remoteAddress: '127.0.0.2' })).statusCode, 200);
    assert.equal((await limited.inject({ url: '/healthz' })).statusCode, 200);
    await limited.close();
  });
  test('CORS is off unless origins are configured', async () => {
    const pre = { method: 'OPTIONS' as const, url: '/api/runs', headers: { origin: 'https://ui.example', 'access-control-request-method': 'GET' } };
    const off = await app.inject({ url: '/api/runs', headers: { ...auth(READ_TOKEN), origin: 'https://ui.example' } });
    assert.equal(off.headers['access-control-allow-origin'], undefined);
    const on = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false, corsOrigins: ['https://ui.example'] });
    const res = await on.inject({ url: '/api/runs', headers: { ...auth(READ_TOKEN), origin: 'https://ui.example' } });
    assert.equal(res.headers['access-control-allow-origin'], 'https://ui.example');
    const other = await on.inject({ url: '/api/runs', headers: { ...auth(READ_TOKEN), origin: 'https://evil.example' } });
    assert.equal(other.headers['access-control-allow-origin'], undefined);
    const preflight = await on.inject(pre);
    assert.equal(preflight.statusCode, 204, preflight.body);
    assert.equal(preflight.headers['access-control-allow-origin'], 'https://ui.example');
    assert.equal((await app.inject(pre)).statusCode, 401, 'without CORS, OPTIONS is an ordinary unauthenticated request');
    await on.close();
  });
});
