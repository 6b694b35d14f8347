// The one shape of an HTTP API's error catalogue (the admin API's, the serving endpoint's): each code has an HTTP
// status and a message template with {placeholders}, filled from the params an error is raised with (a
// placeholder without a param stays as written). Codes are stable, since clients match on them; messages may
// improve.

export interface CatalogueEntry {
  readonly status: number;
  readonly message: string;
}

export type CatalogueParams = Record<string, string | number>;

/** An error with a code of `catalogue`: its message and HTTP status come from the code's entry. */
export class CatalogueError<C extends string> extends Error {
  readonly code: C;
  readonly statusCode: number;

  constructor(catalogue: Readonly<Record<C, CatalogueEntry>>, code: C, params: CatalogueParams, options: { cause?: unknown }) {
    const entry = catalogue[code];
    const message = entry.message.replace(/\{(\w+)\}/g, (whole, key: string) => (key in params ? String(params[key]) : whole));
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.statusCode = entry.status;
  }
}
