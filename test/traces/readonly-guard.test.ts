// queryReadonly itself refuses what readonly=1 lets through on chDB (INTO OUTFILE writes a host file, KILL
// stops other sessions' queries), on both targets, so every caller is covered and not only the admin route.
// The words inside a literal are data: the check reads the engine's parse, not the text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isRlstreamError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { targets } from './targets.ts';

for (const target of targets()) {
  test(`${target.name}: queryReadonly refuses INTO OUTFILE (no file written) and KILL`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('guard');
    const file = join(tmpdir(), `rlstream-outfile-${newId()}.tsv`);
    try {
      for (const sql of [
        `SELECT 1 INTO OUTFILE '${file}'`,
        `SELECT number FROM system.numbers LIMIT 3 INTO OUTFILE '${file}' FORMAT CSV`,
        `SELECT 1 /* c */ INTO\nOUTFILE '${file}' TRUNCATE`,
        'KILL QUERY WHERE 1',
        "KILL QUERY WHERE query_id = 'x' SYNC",
        'KILL MUTATION WHERE 1',
      ]) {
        await assert.rejects(store.queryReadonly(sql), (e) => isRlstreamError(e, 'TRACE_STORE') && /refused/.test(e.message), sql);
      }
      assert.equal(existsSync(file), false, 'no file was written');
      // The words inside a literal are data, not a statement.
      assert.deepEqual((await store.queryReadonly("SELECT 'INTO OUTFILE' AS s")).rows, [{ s: 'INTO OUTFILE' }]);
    } finally {
      rmSync(file, { force: true });
      await store.close();
    }
  });
}
