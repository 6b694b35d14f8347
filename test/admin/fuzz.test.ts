// Runs test/admin/fuzz.sh: schemathesis against the admin API's own /openapi.json with a read token, a control
// token and none, bounded (about a minute a pass). It passes with no server error and no answer outside the
// declared status codes, content types and response schemas. Skipped, saying so, where schemathesis is not
// installed (infra/setup.sh installs it when python3 is there).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

test('schemathesis finds no server error and no answer outside the OpenAPI document', { timeout: 300_000 }, async (t) => {
  const child = spawn('bash', ['test/admin/fuzz.sh'], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NO_COLOR: '1' } });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
  if (code === 3) {
    t.skip('schemathesis is not installed (infra/setup.sh installs it)');
    return;
  }
  for (const line of out.split('\n').filter((l) => /generated, /.test(l))) t.diagnostic(line.trim());
  assert.equal(code, 0, out.slice(-6000));
  assert.equal((out.match(/generated, \d+ passed/g) ?? []).length, 3, 'three passes ran: read, control, no token');
});
