// How the endpoint checks request bodies: JSON Schema (the TypeBox schemas of openai.ts) on the body exactly as it
// was parsed. Nothing is coerced (`content: 5` is not the text "5", `n: 0` is not null) and nothing is removed
// (a field the schema does not list is refused, not dropped), and every refusal names the field, as OpenAI's
// `param` does.
import { Ajv, type ErrorObject } from 'ajv';
import type { FastifySchemaCompiler } from 'fastify';
import { ServeError } from './errors.ts';
import { REFUSED_FIELDS } from './openai.ts';

/** Bodies are checked as sent; path parameters arrive as text and are coerced into their declared types. */
export function serveValidatorCompiler(): FastifySchemaCompiler<object> {
  const options = { removeAdditional: false, allErrors: false, strict: false, useDefaults: true, verbose: true } as const;
  const body = new Ajv({ ...options, coerceTypes: false });
  const text = new Ajv({ ...options, coerceTypes: 'array' });
  return ({ schema, httpPart }) => (httpPart === 'body' ? body : text).compile(schema);
}

/** `/messages/0/content` → `messages[0].content`. */
function fieldPath(instancePath: string, extra?: string): string {
  const parts = instancePath.split('/').slice(1);
  if (extra !== undefined) parts.push(extra);
  let out = '';
  for (const p of parts) out += /^\d+$/.test(p) ? `[${p}]` : out === '' ? p : `.${p}`;
  return out;
}

function describe(e: ErrorObject): string {
  const schema = e.parentSchema as { description?: string } | undefined;
  const why = schema?.description ? ` (${schema.description})` : '';
  switch (e.keyword) {
    case 'additionalProperties':
      return `is not a field this endpoint takes${why}`;
    case 'const':
      return `must be ${JSON.stringify((e.params as { allowedValue: unknown }).allowedValue)}${why}`;
    case 'type':
      return `must be ${String((e.params as { type: unknown }).type)}, got ${e.data === null ? 'null' : Array.isArray(e.data) ? 'array' : typeof e.data}${why}`;
    default:
      return `${e.message ?? 'is invalid'}${why}`;
  }
}

/**
 * One ServeError for a failed body validation, naming the field. Under a union (`anyOf`: a value or null, a string
 * or a list) each branch reports its own error; the one that says most is the deepest, then the one that is not
 * about the type (a value of the right type out of range says more than "must be null").
 */
export function validationError(errors: readonly ErrorObject[], cause: unknown): ServeError {
  const extra = errors.find((e) => e.keyword === 'additionalProperties');
  if (extra) {
    const field = (extra.params as { additionalProperty: string }).additionalProperty;
    const param = fieldPath(extra.instancePath, field);
    const refused = extra.instancePath === '' ? REFUSED_FIELDS[field] : undefined;
    return new ServeError('SRV_ERR_VALIDATION', { detail: `${param}: ${refused ?? describe(extra)}` }, { cause, param });
  }
  const ranked = errors
    .filter((e) => e.keyword !== 'anyOf' && e.keyword !== 'oneOf')
    .map((e, i) => ({ e, i, depth: e.instancePath.split('/').length, typeOnly: e.keyword === 'type' || e.keyword === 'const' && (e.params as { allowedValue: unknown }).allowedValue === null }));
  ranked.sort((a, b) => b.depth - a.depth || Number(a.typeOnly) - Number(b.typeOnly) || a.i - b.i);
  const best = ranked[0]?.e ?? errors[0];
  if (!best) return new ServeError('SRV_ERR_VALIDATION', { detail: 'the body does not match the request schema' }, { cause });
  if (best.keyword === 'required') {
    const param = fieldPath(best.instancePath, (best.params as { missingProperty: string }).missingProperty);
    return new ServeError('SRV_ERR_VALIDATION', { detail: `${param}: is required` }, { cause, param });
  }
  const param = fieldPath(best.instancePath) || 'body';
  // A union's branches: say every type or value it takes, not the first branch's.
  const here = errors.filter((e) => e.instancePath === best.instancePath);
  const alternatives = here.filter((e) => e.keyword === 'type' || e.keyword === 'const').map((e) => (e.keyword === 'type' ? String((e.params as { type: unknown }).type) : JSON.stringify((e.params as { allowedValue: unknown }).allowedValue)));
  const detail = (best.keyword === 'type' || best.keyword === 'const') && new Set(alternatives).size > 1 ? `must be one of ${[...new Set(alternatives)].join(', ')}` : describe(best);
  return new ServeError('SRV_ERR_VALIDATION', { detail: `${param}: ${detail}` }, { cause, param });
}
