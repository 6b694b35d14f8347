// The schema registry contract. Subjects follow Confluent's RecordNameStrategy (the record's full name),
// so an event can travel through any topic (replay, export) and keep its id.

export interface SchemaRegistry {
  /** Register (or find) a schema under a subject; the same schema text always gets the same id. */
  register(subject: string, schema: string): Promise<number>;
  /** The schema text for an id; throws RlstreamError SERDE_UNKNOWN_SCHEMA when the id is unknown. */
  getById(id: number): Promise<string>;
  /** Ids known for a subject, oldest first. */
  versions(subject: string): Promise<number[]>;
  close(): Promise<void>;
}

/** A registry held in memory: for offline commands and unit tests that need no persistence. */
export class MemoryRegistry implements SchemaRegistry {
  private readonly byId = new Map<number, string>();
  private readonly idByText = new Map<string, number>();
  private readonly subjects = new Map<string, number[]>();

  async register(subject: string, schema: string): Promise<number> {
    let id = this.idByText.get(schema);
    if (id === undefined) {
      id = this.byId.size + 1;
      this.byId.set(id, schema);
      this.idByText.set(schema, id);
    }
    const ids = this.subjects.get(subject) ?? [];
    if (!ids.includes(id)) ids.push(id);
    this.subjects.set(subject, ids);
    return id;
  }

  async getById(id: number): Promise<string> {
    const s = this.byId.get(id);
    if (s === undefined) {
      const { RlstreamError } = await import('../errors.ts');
      throw new RlstreamError('SERDE_UNKNOWN_SCHEMA', `schema id ${id} is not registered`);
    }
    return s;
  }

  async versions(subject: string): Promise<number[]> {
    return [...(this.subjects.get(subject) ?? [])];
  }

  async close(): Promise<void> {}
}
