// Keeps the contract's history: writes the current resolved schema of each event to
// history/<Event>/v<N>.avsc when it differs from the latest kept version, and writes the Avro binary
// (unframed, hex) of each fixture value under v1 when missing. Run `npx tsx schemas/snapshot.ts` after
// changing a schema; test/schemas checks that history is current and every version stays readable.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import avro from 'avsc';
import { EVENT_NAMES, SCHEMA_DIR, type EventName, historyVersions, resolvedSchema } from './index.ts';

export const FIXTURE_DIR = join(SCHEMA_DIR, 'fixtures');

/** Fixture JSON holds bytes as {"$base64": "..."}; this turns it into the value avsc encodes. */
export function reviveBytes(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(reviveBytes);
  if (node !== null && typeof node === 'object') {
    const o = node as Record<string, unknown>;
    if (Object.keys(o).length === 1 && typeof o['$base64'] === 'string') return Buffer.from(o['$base64'], 'base64');
    return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, reviveBytes(v)]));
  }
  return node;
}

export function fixtureValue(name: EventName): unknown {
  return reviveBytes(JSON.parse(readFileSync(join(FIXTURE_DIR, `${name}.json`), 'utf8')));
}

/**
 * The fixture as a value of today's schema: its v1 bytes read under the current schema (renamed fields through
 * their aliases, added fields at their defaults), as every reader of today reads a record written under v1. The
 * JSON stays a v1 value; this is the value to encode with the current schema.
 */
export function currentFixtureValue(name: EventName): unknown {
  const bytes = Buffer.from(readFileSync(join(FIXTURE_DIR, `${name}.avro.hex`), 'utf8').trim(), 'hex');
  const current = avro.Type.forSchema(resolvedSchema(name) as avro.Schema, { wrapUnions: false });
  return current.fromBuffer(bytes, current.createResolver(historyType(name, 1)));
}

export function historyType(name: EventName, version: number): avro.Type {
  const v = historyVersions(name).find((h) => h.version === version);
  if (!v) throw new Error(`no history version v${version} of ${name}`);
  return avro.Type.forSchema(v.schema as avro.Schema, { wrapUnions: false });
}

function canonical(schema: unknown): string {
  return JSON.stringify(schema);
}

export function snapshot(): string[] {
  const written: string[] = [];
  for (const name of EVENT_NAMES) {
    const current = resolvedSchema(name);
    const versions = historyVersions(name);
    const latest = versions[versions.length - 1];
    if (!latest || canonical(latest.schema) !== canonical(current)) {
      const dir = join(SCHEMA_DIR, 'history', name);
      mkdirSync(dir, { recursive: true });
      const path = join(dir, `v${(latest?.version ?? 0) + 1}.avsc`);
      writeFileSync(path, JSON.stringify(current, null, 1) + '\n');
      written.push(path);
    }
    const hex = join(FIXTURE_DIR, `${name}.avro.hex`);
    if (existsSync(join(FIXTURE_DIR, `${name}.json`)) && !existsSync(hex)) {
      writeFileSync(hex, historyType(name, 1).toBuffer(fixtureValue(name)).toString('hex') + '\n');
      written.push(hex);
    }
  }
  return written;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const written = snapshot();
  for (const w of written) process.stdout.write(`wrote ${w}\n`);
  if (written.length === 0) process.stdout.write('history and fixtures are current\n');
}
