// commitOffset (core/processor.ts): the one rule for the offset a transaction commits, used by the stream
// processors (records their handlers hold) and the trainer's intake (records it carries to the next step). Checked
// against its definition over generated cases, and on a held set too large for Math.min(...spread).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { commitOffset } from '../../core/processor.ts';
import { rng } from '../../core/random.ts';

test('the committed offset is past the read records and the markers after them, and never past a held record', () => {
  const r = rng(7);
  for (let k = 0; k < 2000; k++) {
    const next = Math.floor(r() * 100);
    const position = r() < 0.3 ? undefined : next + Math.floor((r() - 0.3) * 10);
    const held = Array.from({ length: Math.floor(r() * 4) }, () => Math.floor(r() * 120));
    const c = commitOffset(next, position, held);
    const furthest = Math.max(next, position ?? next);
    const why = JSON.stringify({ next, position, held, c });
    for (const h of held) assert.ok(c <= h, `passes held ${h}: ${why}`);
    assert.ok(c <= furthest, why);
    // As far as allowed: the furthest read point, or the earliest held record below it.
    assert.equal(c, Math.min(furthest, ...held), why);
  }
  assert.equal(commitOffset(10, 14, []), 14, 'markers after the last record are committed past');
  assert.equal(commitOffset(10, 7, []), 10, 'a position behind the records read (a rewind) never lowers it');
  assert.equal(commitOffset(10, 14, [12, 11]), 11);
});

test('a large held set does not overflow the stack', () => {
  const held = Array.from({ length: 300_000 }, (_, i) => 1_000_000 - i);
  assert.equal(commitOffset(2_000_000, undefined, held), 700_001);
});
