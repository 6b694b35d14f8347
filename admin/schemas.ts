// TypeBox schemas shared by the route plugins: the error body every failure has, and small helpers that
// give each route the same documented response set.
import { Type, type TSchema } from '@sinclair/typebox';

export const ErrorBody = Type.Object(
  {
    statusCode: Type.Integer({ minimum: 400, maximum: 599 }),
    code: Type.String({ pattern: '^ADM_ERR_[A-Z_]+$', description: 'Stable error code (admin/errors.ts).' }),
    message: Type.String(),
  },
  { $id: 'AdminError', title: 'AdminError' },
);

/** 200 with this body, and the error body for every 4xx and 5xx. */
export function responses(ok: TSchema, okStatus = 200): Record<string, TSchema> {
  return { [okStatus]: ok, '4xx': Type.Ref('AdminError'), '5xx': Type.Ref('AdminError') };
}

export const RunIdParams = Type.Object({ runId: Type.String({ minLength: 1, maxLength: 200, pattern: '^[A-Za-z0-9._:-]+$' }) });

/** Any JSON value: rows of SQL results and run configs are free-form. */
export const AnyObject = Type.Object({}, { additionalProperties: true });

export const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

/** A run as the API shows it (registered by the server: runs, training and control routes refer to it). */
export const Run = Type.Object(
  {
    id: Type.String(),
    status: Type.Union(['running', 'paused', 'stopping', 'stopped', 'completed', 'failed', 'unknown'].map((s) => Type.Literal(s))),
    startedMs: Nullable(Type.Number()),
    stalenessBound: Nullable(Type.Integer()),
    lastStep: Nullable(Type.Integer()),
    lastPolicyVersion: Nullable(Type.Integer()),
    lastEventMs: Nullable(Type.Number()),
    consumerGroups: Type.Record(Type.String(), Type.Object({ groupId: Type.String(), topics: Type.Array(Type.String()) })),
  },
  { $id: 'Run', title: 'Run' },
);
