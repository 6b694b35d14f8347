// The OpenAPI document: valid OpenAPI 3 structure, every registered API route documented with a summary,
// parameters for every path template, a JSON response and the error schema, bearer security where needed.
// The structural rules are checked here with ajv against a compact schema of the parts of OpenAPI 3.0 used.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Ajv } from 'ajv';
import { buildAdminServer } from '../../admin/server.ts';
import { fixture, TOKENS } from './helpers.ts';

// A subset of the OpenAPI 3.0 schema (https://spec.openapis.org/oas/3.0/schema): required fields and shapes.
const OPENAPI_3 = {
  type: 'object',
  required: ['openapi', 'info', 'paths'],
  properties: {
    openapi: { type: 'string', pattern: '^3\\.0\\.\\d+$' },
    info: { type: 'object', required: ['title', 'version'], properties: { title: { type: 'string' }, version: { type: 'string' } } },
    paths: {
      type: 'object',
      propertyNames: { pattern: '^/' },
      additionalProperties: {
        type: 'object',
        propertyNames: { enum: ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace', 'parameters', 'summary', 'description'] },
        additionalProperties: {
          type: 'object',
          required: ['responses'],
          properties: {
            parameters: {
              type: 'array',
              items: { type: 'object', required: ['name', 'in'], properties: { in: { enum: ['query', 'header', 'path', 'cookie'] }, required: { type: 'boolean' }, schema: { type: 'object' } } },
            },
            requestBody: { type: 'object', required: ['content'] },
            responses: {
              type: 'object',
              minProperties: 1,
              propertyNames: { pattern: '^([1-5](\\d\\d|XX)|default)$' },
              additionalProperties: { type: 'object', required: ['description'] },
            },
            security: { type: 'array' },
          },
        },
      },
    },
    components: { type: 'object' },
  },
};

test('the OpenAPI document is valid and documents every API route', async () => {
  const f = await fixture();
  const app = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false });
  try {
    const res = await app.inject({ url: '/openapi.json' });
    assert.equal(res.statusCode, 200);
    const doc = JSON.parse(res.body) as {
      paths: Record<string, Record<string, { summary?: string; parameters?: { name: string; in: string; required?: boolean }[]; responses: Record<string, { content?: Record<string, unknown> }>; security?: unknown[] }>>;
      components: { schemas?: Record<string, unknown>; securitySchemes?: Record<string, { type: string; scheme: string }> };
    };
    const ajv = new Ajv({ allErrors: true, strict: false });
    const valid = ajv.validate(OPENAPI_3, doc);
    assert.ok(valid, ajv.errorsText(ajv.errors));
    assert.deepEqual(doc.components.securitySchemes?.['bearerAuth'], { type: 'http', scheme: 'bearer' });

    // Every $ref points at a component that exists.
    const refs = [...res.body.matchAll(/"\$ref":"#\/components\/schemas\/([^"]+)"/g)].map((m) => m[1]!);
    for (const r of new Set(refs)) assert.ok(doc.components.schemas?.[r], `component ${r} exists`);

    const ops = Object.entries(doc.paths).flatMap(([path, o]) => Object.entries(o).map(([method, op]) => ({ path, method, op })));
    for (const { path, method, op } of ops) {
      const where = `${method.toUpperCase()} ${path}`;
      assert.ok(op.summary, `${where} has a summary`);
      for (const name of [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!)) {
        assert.ok(op.parameters?.some((p) => p.in === 'path' && p.name === name && p.required === true), `${where} documents path parameter ${name}`);
      }
      const ok = Object.keys(op.responses).find((c) => c.startsWith('2'));
      assert.ok(ok, `${where} documents a success response`);
      assert.ok(op.responses['4XX'] ?? op.responses['4xx'], `${where} documents its errors`);
    }

    // Every API route that Fastify registered appears in the document (static pages and the docs UI aside).
    const documented = new Set(ops.map((o) => `${o.method.toUpperCase()} ${o.path}`));
    const api = app.admin.routes.filter((r) => r.url.startsWith('/api/') || ['/metrics', '/healthz', '/readyz'].includes(r.url));
    assert.ok(api.length >= 26, `${api.length} API routes`);
    for (const r of api) assert.ok(documented.has(`${r.method} ${r.url.replace(/:(\w+)/g, '{$1}')}`), `${r.method} ${r.url} is documented`);
    assert.equal(documented.size, api.length, 'nothing documented that is not a route');
    const ui = await app.inject({ url: '/docs/' });
    assert.ok(ui.statusCode === 200 || ui.statusCode === 302, `swagger UI answers (${ui.statusCode})`);
  } finally {
    await app.close();
    await f.close();
  }
});
