// The embedded log's durability as core/log/types.ts documents it, checked on the system calls (strace): with
// the default fsync policy a plain send and an offset commit fsync nothing, a transaction commit fsyncs the
// journal, and creating a topic, a segment or the first journal fsyncs the directories that name them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

// Skipped where strace is missing or may not trace (a container without ptrace).
const strace = spawnSync('strace', ['-f', '-e', 'trace=fsync', '-o', '/dev/null', 'true']).status === 0 ? null : 'strace is not installed or cannot trace here';

/** The script's phases, each marked by a write to a path the trace shows (an openat of a marker name). */
function script(dir: string): string {
  const log = JSON.stringify(join(import.meta.dirname, '../../core/log/embedded/index.ts'));
  return `import { openEmbeddedLog } from ${log};
    import { existsSync } from 'node:fs';
    const mark = (name) => existsSync(${JSON.stringify(dir)} + '/MARK-' + name);
    const log = openEmbeddedLog({ dir: ${JSON.stringify(join(dir, 'log'))}, segmentBytes: 4096 });
    mark('create');
    await log.createTopic({ name: 't', partitions: 1 });
    mark('send');
    const p = await log.producer();
    await p.send('t', [{ value: Buffer.alloc(100) }]);
    mark('commit');
    const c = await log.consumer({ groupId: 'g', topics: ['t'] });
    await c.commit([{ topic: 't', partition: 0, offset: 1 }]);
    mark('roll');
    for (let i = 0; i < 60; i++) await p.send('t', [{ value: Buffer.alloc(100) }]);
    mark('txn');
    const txn = await (await log.producer({ transactionalId: 'x' })).transaction();
    await txn.send('t', [{ value: Buffer.alloc(100) }]);
    await txn.commit();
    mark('end');
    await log.close();`;
}

interface Phase {
  /** Paths fsynced in the phase (directories end with /). */
  fsynced: string[];
}

/** Parse `strace -f -y` output: fsync(fd<path>) calls, split into phases by the marker stat calls. */
function phases(trace: string): Record<string, Phase> {
  const out: Record<string, Phase> = {};
  let phase = 'open';
  out[phase] = { fsynced: [] };
  for (const line of trace.split('\n')) {
    const mark = /MARK-(\w+)/.exec(line);
    if (mark && /stat|access/.test(line)) {
      phase = mark[1]!;
      out[phase] ??= { fsynced: [] };
      continue;
    }
    const f = /\bf(?:data)?sync\(\d+<([^>]+)>\)\s+=\s+0/.exec(line);
    if (f) out[phase]!.fsynced.push(f[1]!);
  }
  return out;
}

test('fsyncs happen where core/log/types.ts says: transactions, new topics, segments and journals, not plain sends or commits', { skip: strace ?? false, timeout: 60_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-fsync-'));
  try {
    const traceFile = join(dir, 'trace.txt');
    const res = spawnSync('strace', ['-f', '-y', '-e', 'trace=fsync,fdatasync,newfstatat,statx,stat,access', '-o', traceFile, process.execPath, '--import', 'tsx', '--input-type=module', '-e', script(dir)], { encoding: 'utf8' });
    assert.equal(res.status, 0, res.stderr);
    const p = phases(readFileSync(traceFile, 'utf8'));
    const logDir = join(dir, 'log');
    const topic = join(logDir, 'topics', 't');
    // Opening a new log: the topics directory's and the first journal's names.
    assert.ok(p['open']!.fsynced.includes(logDir), `open: ${p['open']!.fsynced.join(', ')}`);
    // createTopic: the partition directory (its first segment), the topic directory, meta.json, topics/.
    for (const path of [join(topic, '0'), topic, join(topic, 'meta.json.tmp'), join(logDir, 'topics')]) {
      assert.ok(p['create']!.fsynced.includes(path), `createTopic fsyncs ${path}: ${p['create']!.fsynced.join(', ')}`);
    }
    assert.deepEqual(p['send']!.fsynced, [], 'a plain send fsyncs nothing');
    assert.deepEqual(p['commit']!.fsynced, [], 'an offset commit fsyncs nothing');
    // A roll: the sealed segment, then the directory naming the new one.
    assert.ok(p['roll']!.fsynced.some((f) => f.startsWith(join(topic, '0') + '/') && f.endsWith('.log')), `roll: ${p['roll']!.fsynced.join(', ')}`);
    assert.ok(p['roll']!.fsynced.includes(join(topic, '0')));
    assert.ok(p['txn']!.fsynced.some((f) => /journal-\d+\.log$/.test(f)), `a transaction fsyncs the journal: ${p['txn']!.fsynced.join(', ')}`);
    // close: the segments and the journal (offsets committed since the last fsync).
    assert.ok(p['end']!.fsynced.some((f) => /journal-\d+\.log$/.test(f)), `close: ${p['end']!.fsynced.join(', ')}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
