// The fields the event contract renamed, found from the schemas themselves (a field that carries Avro aliases), and
// the helpers to find them in a history version's schema and in a decoded value: shared by the tests that show a
// rename keeps old records readable (test/serde/renamed-fields.test.ts against the embedded registry,
// test/kafka/http-registry.test.ts against Apicurio).
import { EVENT_NAMES, resolvedSchema, type EventName } from '../../schemas/index.ts';

export interface Field {
  name: string;
  type: unknown;
  aliases?: string[];
}

/** A renamed field: its event, the record fields leading to the record that holds it, its name and old names. */
export interface Renamed {
  event: EventName;
  parent: string[];
  name: string;
  aliases: string[];
}

/** The fields of a record schema, or of the record a field's type is (named types are inlined at first use). */
export function fieldsOf(schema: unknown): Field[] {
  return (schema as { fields?: Field[] } | null)?.fields ?? [];
}

export function isRecord(schema: unknown): boolean {
  return typeof schema === 'object' && schema !== null && !Array.isArray(schema) && (schema as { type?: unknown }).type === 'record';
}

/**
 * Every field of today's contract that carries aliases, at any depth. A record reached other than as a field's
 * type (array items, union branches, map values) is walked too, with '*' in its path, so an alias there is listed
 * (and the exact list in renamed-fields.test.ts fails) rather than silently untested. A named type is walked where
 * it is defined (its first use): later uses name it, and its fields are the same.
 */
export function renamed(): Renamed[] {
  const out: Renamed[] = [];
  const walk = (event: EventName, schema: unknown, parent: string[]): void => {
    if (Array.isArray(schema)) return schema.forEach((b) => walk(event, b, [...parent, '*']));
    if (typeof schema !== 'object' || schema === null) return;
    const s = schema as { type?: unknown; items?: unknown; values?: unknown };
    if (s.type === 'array') return walk(event, s.items, [...parent, '*']);
    if (s.type === 'map') return walk(event, s.values, [...parent, '*']);
    if (!isRecord(schema)) return walk(event, s.type, parent);
    for (const f of fieldsOf(schema)) {
      if ((f.aliases ?? []).length > 0) out.push({ event, parent, name: f.name, aliases: f.aliases! });
      walk(event, f.type, [...parent, f.name]);
    }
  };
  for (const event of EVENT_NAMES) walk(event, resolvedSchema(event), []);
  return out;
}

/** The record schema at `parent` in a version's schema (null when that version has no such record). */
export function recordAt(schema: unknown, parent: string[]): unknown {
  let at: unknown = schema;
  for (const name of parent) {
    const f = fieldsOf(at).find((x) => x.name === name);
    if (!f || !isRecord(f.type)) return null;
    at = f.type;
  }
  return at;
}

/** The value's record at `parent` (a decoded value follows the schema, so every step is a plain object). */
export function valueAt(value: unknown, parent: string[]): Record<string, unknown> {
  return parent.reduce((v, k) => (v as Record<string, unknown>)[k], value) as Record<string, unknown>;
}

/** The name a version gave the field (one of its aliases), or undefined when that version did not have it. */
export function oldNameIn(schema: unknown, r: Renamed): string | undefined {
  return fieldsOf(recordAt(schema, r.parent)).find((f) => r.aliases.includes(f.name))?.name;
}

/** Today's schema of an event with the aliases of one renamed field taken off. */
export function stripped(r: Renamed): unknown {
  const copy = JSON.parse(JSON.stringify(resolvedSchema(r.event))) as unknown;
  const field = fieldsOf(recordAt(copy, r.parent)).find((f) => f.name === r.name)!;
  delete field.aliases;
  return copy;
}

/** The field's place, as the tests name it: Event.record.field. */
export const key = (r: Renamed): string => [r.event, ...r.parent, r.name].join('.');
