// A LoRA policy version (trainer.lora) is an adapter file bound to the version-0 weights it sits on (metadata
// base_uri, base_checksum). A generated corpus of ways the binding can be wrong: the adapter naming another checksum
// (random, or one hex digit changed), naming no base, a base that is missing, and a base damaged after it was first
// verified (a byte flipped at a random place, truncated, extended, replaced by another file of the same size): every
// one is refused before a backend loads it, with WEIGHTS_CHECKSUM or WEIGHTS_FORMAT, and the intact pair still loads
// after each. The base is hashed once per process while it is unchanged: the last case shows a damaged base is hashed
// again, not taken from that cache.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { isRlstreamError } from '../../core/errors.ts';
import { rng } from '../../core/random.ts';
import { sha256File } from '../../core/weights/checksum.ts';
import { writeSafetensors } from '../../core/weights/safetensors.ts';
import { LORA_FILE_FORMAT, loraMetadata } from '../../native/lora.ts';
import { verifyPolicyVersion } from '../../producers/policy-sync.ts';
import type { PolicyVersion } from '../../schemas/generated/types.ts';

const CASES = 60;

function hex(rand: () => number, n: number): string {
  let s = '';
  for (let i = 0; i < n; i++) s += '0123456789abcdef'[Math.floor(rand() * 16)]!;
  return s;
}

test('an adapter version loads only over the exact base it names (generated corpus of wrong bindings and damaged bases)', { timeout: 120_000 }, async () => {
  const rand = rng(52);
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-adapter-base-'));
  try {
    const base = join(dir, 'base.safetensors');
    const baseBytes = Buffer.from(Array.from({ length: 4096 }, () => Math.floor(rand() * 256)));
    writeFileSync(base, baseBytes);
    const baseSum = await sha256File(base);
    let n = 0;
    /** A version whose adapter names `meta` as its base; the event's checksum is the adapter file's own. */
    async function adapterVersion(meta: Record<string, string>): Promise<PolicyVersion> {
      const path = join(dir, `adapter-${n++}.safetensors`);
      const A = { shape: [2, 4], data: Float32Array.from({ length: 8 }, () => rand()) };
      const B = { shape: [4, 2], data: Float32Array.from({ length: 8 }, () => rand()) };
      await writeSafetensors(path, [['model.layers.0.self_attn.q_proj.lora_A.weight', A], ['model.layers.0.self_attn.q_proj.lora_B.weight', B]], { ...loraMetadata({ rank: 2, alpha: 4, targets: ['q_proj'], dropout: 0, seed: 0 }), ...meta });
      return { version: n, weights_uri: path, checksum: await sha256File(path), format: LORA_FILE_FORMAT, config_json: '{}' } as unknown as PolicyVersion;
    }
    const refused = async (pv: PolicyVersion, what: string) =>
      assert.rejects(verifyPolicyVersion(pv), (e: unknown) => isRlstreamError(e) && (e.code === 'WEIGHTS_CHECKSUM' || e.code === 'WEIGHTS_FORMAT'), what);
    const intact = async (what: string) => {
      const u = await verifyPolicyVersion(await adapterVersion({ base_uri: base, base_checksum: baseSum }));
      assert.equal(u.adapter?.baseWeightsPath, base, `${what}: the intact pair loads`);
    };
    await intact('first');

    const kinds = ['random checksum', 'one digit changed', 'no base named', 'base missing', 'byte flipped', 'truncated', 'extended', 'replaced, same size', 'upper-case digit changed'] as const;
    const seen = new Map<string, number>();
    for (let c = 0; c < CASES; c++) {
      const kind = kinds[c % kinds.length]!;
      seen.set(kind, (seen.get(kind) ?? 0) + 1);
      const what = `case ${c}: ${kind}`;
      if (kind === 'random checksum') await refused(await adapterVersion({ base_uri: base, base_checksum: hex(rand, 64) }), what);
      else if (kind === 'one digit changed' || kind === 'upper-case digit changed') {
        const i = Math.floor(rand() * 64);
        const d = '0123456789abcdef'.replace(baseSum[i]!, '');
        let wrong = baseSum.slice(0, i) + d[Math.floor(rand() * d.length)]! + baseSum.slice(i + 1);
        if (kind === 'upper-case digit changed') wrong = wrong.toUpperCase();
        await refused(await adapterVersion({ base_uri: base, base_checksum: wrong }), what);
      } else if (kind === 'no base named') {
        const meta: Record<string, string> = rand() < 0.5 ? { base_uri: base } : { base_checksum: baseSum };
        await refused(await adapterVersion(meta), what);
      } else if (kind === 'base missing') {
        await refused(await adapterVersion({ base_uri: join(dir, `gone-${c}.safetensors`), base_checksum: baseSum }), what);
      } else {
        // Damage after the base was verified (and cached as verified). A coarse clock tick apart, so the damage
        // shows in the file's ctime as it would after any real hash of a multi-GB base.
        await sleep(15);
        if (kind === 'byte flipped') {
          const b = readFileSync(base);
          const at = Math.floor(rand() * b.length);
          b[at] = b[at]! ^ (1 + Math.floor(rand() * 255));
          writeFileSync(base, b);
        } else if (kind === 'truncated') truncateSync(base, Math.floor(rand() * baseBytes.length));
        else if (kind === 'extended') appendFileSync(base, Buffer.from([Math.floor(rand() * 256)]));
        else {
          const other = join(dir, `other-${c}.safetensors`);
          const b = Buffer.from(baseBytes);
          b[Math.floor(rand() * b.length)]! ^= 0x5a;
          writeFileSync(other, b);
          renameSync(other, base);
        }
        await refused(await adapterVersion({ base_uri: base, base_checksum: baseSum }), what);
        writeFileSync(base, baseBytes);
      }
      await intact(what);
    }
    assert.equal(seen.size, kinds.length, 'every kind of wrong binding was generated');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
