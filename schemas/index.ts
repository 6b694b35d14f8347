// Loads the Avro contract: shared named types from types/, one record per event from events/.
// Every event schema is resolved into a self-contained schema (named types inlined at first use),
// which is what registries store and what fixtures and history snapshots are made of.
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import avro from 'avsc';

export const SCHEMA_DIR = dirname(fileURLToPath(import.meta.url));

export const EVENT_NAMES = [
  'TrajectoryStarted',
  'TurnCompleted',
  'ToolCallCompleted',
  'TrajectoryCompleted',
  'RewardedTrajectory',
  'AdvantagedTrajectory',
  'PolicyVersion',
  'TrainStep',
  'Control',
  'DeadLetter',
  'Evaluation',
] as const;
export type EventName = (typeof EVENT_NAMES)[number];

/** Shared named types, in dependency order (a type only references types listed before it). */
export const SHARED_TYPE_NAMES = [
  'ToolCall',
  'Message',
  'ToolSpec',
  'SamplingParams',
  'DatasetRef',
  'NamedValue',
  'Trajectory',
  'RewardInfo',
  'GroupStats',
] as const;

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function readJson(path: string): Json {
  return JSON.parse(readFileSync(path, 'utf8')) as Json;
}

function sharedTypeSchemas(): Map<string, Json> {
  const byName = new Map<string, Json>();
  for (const name of SHARED_TYPE_NAMES) byName.set(`rlstream.${name}`, readJson(join(SCHEMA_DIR, 'types', `${name}.avsc`)));
  return byName;
}

/** Replace references to shared named types by their definitions, each inlined once (Avro requires that). */
function inline(node: Json, shared: Map<string, Json>, defined: Set<string>): Json {
  if (typeof node === 'string') {
    const def = shared.get(node);
    if (def === undefined || defined.has(node)) return node;
    defined.add(node);
    return inline(def, shared, defined);
  }
  if (Array.isArray(node)) return node.map((n) => inline(n, shared, defined));
  if (node !== null && typeof node === 'object') {
    const out: { [key: string]: Json } = {};
    for (const [k, v] of Object.entries(node)) {
      // Only schema positions can hold type references: `type` and `items`/`values`; names and docs are text.
      out[k] = k === 'type' || k === 'items' || k === 'values' || k === 'fields' ? inline(v, shared, defined) : v;
    }
    return out;
  }
  return node;
}

/** The self-contained (resolved) schema of one event, as JSON. */
export function resolvedSchema(name: EventName): Json {
  const shared = sharedTypeSchemas();
  return inline(readJson(join(SCHEMA_DIR, 'events', `${name}.avsc`)), shared, new Set());
}

/** Canonical text of a resolved schema (what registries store and compare). */
export function schemaText(name: EventName): string {
  return JSON.stringify(resolvedSchema(name));
}

let cache: Map<EventName, avro.Type> | undefined;

/** avsc Types of the current version of every event. */
export function eventTypes(): Map<EventName, avro.Type> {
  if (cache) return cache;
  cache = new Map();
  for (const name of EVENT_NAMES) cache.set(name, avro.Type.forSchema(resolvedSchema(name) as avro.Schema, { wrapUnions: false }));
  return cache;
}

export function eventType(name: EventName): avro.Type {
  const t = eventTypes().get(name);
  if (!t) throw new Error(`unknown event ${name}`);
  return t;
}

export function isEventName(name: string): name is EventName {
  return (EVENT_NAMES as readonly string[]).includes(name);
}

/** Previous versions kept under history/<Event>/v<N>.avsc (resolved snapshots), oldest first. */
export function historyVersions(name: EventName): { version: number; schema: Json }[] {
  const dir = join(SCHEMA_DIR, 'history', name);
  let files: string[] = [];
  try {
    files = readdirSync(dir).filter((f) => /^v\d+\.avsc$/.test(f));
  } catch {
    return [];
  }
  return files
    .map((f) => ({ version: Number(f.slice(1, -5)), schema: readJson(join(dir, f)) }))
    .sort((a, b) => a.version - b.version);
}
