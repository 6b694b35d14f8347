// Tokens from files (--token-file, RLSTREAM_ADMIN_TOKENS_FILE, RLSTREAM_SERVE_TOKENS_FILE): a file others can
// read is refused naming the fix; a bad entry names the file. A real `rlstream admin` with tokens from a file,
// from the file variable and from RLSTREAM_ADMIN_TOKENS accepts each, and none of the token variables is left
// in its environment (/proc/<pid>/environ), read before anything else ran.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { envTokens, readTokenFile } from '../../core/auth/tokens.ts';
import { SECRET_VARIABLES } from '../../core/auth/environ.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { recordRun, startAdmin } from './helpers.ts';

const dir = mkdtempSync(join(tmpdir(), 'rlstream-token-file-'));
process.once('exit', () => rmSync(dir, { recursive: true, force: true }));

function tokenFile(name: string, text: string, mode = 0o600): string {
  const path = join(dir, name);
  writeFileSync(path, text, { mode });
  chmodSync(path, mode);
  return path;
}

test('a token file: entries one a line with comments, its owner\'s alone', () => {
  const ok = tokenFile('ok', '# the dashboard\nread:file-read-token-0123456789\n\ncontrol:file-control-token-0123456789  # ops\n');
  assert.deepEqual(readTokenFile(ok).map((t) => [t.role, t.token]), [['read', 'file-read-token-0123456789'], ['control', 'file-control-token-0123456789']]);
  for (const mode of [0o644, 0o640, 0o604, 0o620]) {
    const loose = tokenFile(`loose-${mode.toString(8)}`, 'read:file-read-token-0123456789\n', mode);
    assert.throws(() => readTokenFile(loose), (e) => isRlstreamError(e, 'CONFIG_INVALID') && e.message.includes(`chmod 600 ${loose}`), mode.toString(8));
  }
  assert.throws(() => readTokenFile(tokenFile('empty', '# nothing\n')), /holds no token/);
  assert.throws(() => readTokenFile(tokenFile('bad-role', 'admin:file-token-0123456789\n')), (e) => isRlstreamError(e, 'CONFIG_INVALID') && e.message.includes('bad-role') && e.message.includes('entry 1'));
  assert.throws(() => readTokenFile(join(dir, 'missing')), /cannot be read/);
  assert.deepEqual(envTokens({ RLSTREAM_ADMIN_TOKENS_FILE: ok, RLSTREAM_ADMIN_TOKENS: 'read:env-read-token-0123456789' }).map((t) => t.token), ['env-read-token-0123456789', 'file-read-token-0123456789', 'file-control-token-0123456789']);
});

test('rlstream admin takes tokens from --token-file and the variables, and keeps none in its environment', { timeout: 120_000 }, async (t) => {
  const logDir = join(dir, 'log');
  await recordRun(logDir, 1);
  const flag = tokenFile('flag', 'control:flag-control-token-0123456789\n');
  const viaVariable = tokenFile('variable', 'read:variable-read-token-0123456789\n');
  const admin = await startAdmin(logDir, join(dir, 'traces'), 'read:env-read-token-0123456789', {
    args: ['--token-file', flag],
    env: { RLSTREAM_ADMIN_TOKENS_FILE: viaVariable, RLSTREAM_SERVE_TOKENS: 'serve-token-0123456789', RLSTREAM_ADMIN_TOKEN: 'client-token-0123456789' },
  });
  t.after(() => admin.stop());
  for (const token of ['flag-control-token-0123456789', 'variable-read-token-0123456789', 'env-read-token-0123456789']) {
    const res = await fetch(`${admin.url}/api/runs`, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(res.status, 200, token);
  }
  const environ = readFileSync(`/proc/${admin.pid}/environ`, 'utf8');
  for (const name of SECRET_VARIABLES) assert.equal(environ.includes(`${name}=`), false, `${name} is gone from /proc/<pid>/environ`);
  for (const secret of ['token-0123456789', viaVariable]) assert.equal(environ.includes(secret), false, secret);
});
