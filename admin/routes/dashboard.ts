// Serves the dashboard (admin/public: plain HTML, CSS and JS, no build step) from a fixed list of files read
// once at start, so no request path ever reaches the file system. The pages hold no run data, so they are
// public; the data comes from the API with the token the page asks for.
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import { AdminError } from '../errors.ts';

const PUBLIC_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', 'public');
const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
};
// Everything from this origin, nothing from anywhere else; no inline scripts.
const CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'";

function loadFiles(): Map<string, { body: Buffer; type: string }> {
  const files = new Map<string, { body: Buffer; type: string }>();
  for (const name of readdirSync(PUBLIC_DIR)) {
    const type = TYPES[extname(name)];
    if (type) files.set(name, { body: readFileSync(join(PUBLIC_DIR, name)), type });
  }
  return files;
}

const dashboard: FastifyPluginAsync = async (app) => {
  const files = loadFiles();
  const config = { access: 'public' as const };

  app.get('/', { config, schema: { hide: true } }, async (_req, reply) => reply.redirect('/dashboard/'));
  // Browsers ask for it on every page; there is none, and saying so needs no token.
  app.get('/favicon.ico', { config, schema: { hide: true } }, async () => {
    throw new AdminError('ADM_ERR_NOT_FOUND', { what: 'favicon.ico' });
  });
  app.get('/dashboard/', { config, schema: { hide: true } }, async (_req, reply) => {
    const f = files.get('index.html');
    if (!f) throw new AdminError('ADM_ERR_NOT_FOUND', { what: 'index.html' });
    return reply.header('content-type', f.type).header('content-security-policy', CSP).header('cache-control', 'no-cache').send(f.body);
  });
  app.get<{ Params: { file: string } }>(
    '/dashboard/:file',
    { config, schema: { hide: true, params: Type.Object({ file: Type.String({ pattern: '^[a-z0-9-]+\\.(js|css|svg|html)$' }) }) } },
    async (req, reply) => {
      const f = files.get(req.params.file);
      if (!f) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `file ${req.params.file}` });
      return reply.header('content-type', f.type).header('content-security-policy', CSP).header('cache-control', 'no-cache').send(f.body);
    },
  );
};

export default dashboard;
