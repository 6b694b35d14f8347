// The addon's codecs: the embedded log's frame checks and sealing (CRC-32), Avro → RowBinary transcoding for the
// trace sink, and ClickHouse Native blocks. Each returns null (or the caller's fallback runs) when the addon is
// not built, so the lowest layer works without it.
import { call, callAsync, loadedAddon, native } from './addon.ts';

const frameState = new Float64Array(1);

/** CRC-32 of buf continued from crc (0 to start), as node:zlib's crc32 computes it, several times faster. */
export function nativeCrc32(buf: Uint8Array, crc = 0): number {
  return call(() => native().crc32(buf, crc));
}

/**
 * The embedded log's frames of buf[from, limit), lengths written, get their body CRCs written; returns the CRC of
 * the whole range after that. Null when the addon is not built (or predates this call): the caller does it.
 */
export function sealFrames(buf: Uint8Array, from: number, limit: number): number | null {
  const a = loadedAddon();
  if (!a || typeof a.sealFrames !== 'function') return null;
  return call(() => a.sealFrames(buf, from, limit));
}

/**
 * The embedded log's frame check over buf[from, limit): the position after the last whole, CRC-valid record frame
 * (at most maxRecords of them), and how many there were. Null when the addon is not built (or predates this
 * call): the caller checks frames itself.
 */
export function checkFrames(buf: Uint8Array, from: number, limit: number, maxRecords: number, minBody: number, maxBody: number): { end: number; records: number } | null {
  const a = loadedAddon();
  if (!a || typeof a.checkFrames !== 'function') return null;
  const end = call(() => a.checkFrames(buf, from, limit, Math.min(maxRecords, 1e15), minBody, maxBody, frameState));
  return { end, records: frameState[0]! };
}

/**
 * Avro records → RowBinary rows through a program from consumers/traces/transcode.ts (which documents it).
 * Records from..to-1 lie in `base` (a view of their whole ArrayBuffer), record i at byte starts[i] with
 * lengths[i] bytes; the body after `headerBytes` is appended to `out` at state[0] (advanced; state[1] counts the
 * rows); status[i] is 1 when record i was written, 0 when it declined (nothing written: the caller takes the
 * general path). Returns the index of the first record not handled: short of `to` when `out` lacks room for
 * that record (the caller grows it and calls again from there).
 */
export function transcodeRecords(
  program: Int32Array,
  symbols: Uint8Array,
  base: Uint8Array,
  starts: Float64Array,
  lengths: Int32Array,
  from: number,
  to: number,
  headerBytes: number,
  out: Uint8Array,
  state: Float64Array,
  status: Uint8Array,
): number {
  return call(() => native().transcode(program, symbols, base, starts, lengths, from, to, headerBytes, out, state, status));
}

/** As writeNativeBlock, resolving with the block as a Buffer instead (a request body). */
export function nativeBlock(payload: Uint8Array, rows: number, layout: Int32Array, heads: Uint8Array, headEnds: Int32Array, keys: Int32Array): Promise<Buffer> | null {
  const a = loadedAddon();
  if (!a || typeof a.nativeBlock !== 'function') return null;
  return callAsync(() => a.nativeBlock!(payload, rows, layout, heads, headEnds, keys));
}

/**
 * Writes the ClickHouse Native block of `rows` RowBinary rows to a new file at `path`, on the libuv pool, and
 * resolves with its size (native/src/native_block.h documents both layouts). layout has 3 words a column: kind
 * (0 fixed, 1 string), width, flags (1 Nullable, 2 Array); column i's Native header (its name and type, as
 * strings) is heads[headEnds[i-1], headEnds[i]). keys has 2 words a column of the table's sorting key, in key
 * order (column index; 0 String, 1 unsigned, 2 signed integer): the rows are written in that order, so the
 * engine need not sort them (empty: as they came). Null when the addon is not built (or predates this call): the
 * caller writes RowBinary. Rejects, naming the column and row, when the rows do not fill the payload exactly.
 */
export function writeNativeBlock(path: string, payload: Uint8Array, rows: number, layout: Int32Array, heads: Uint8Array, headEnds: Int32Array, keys: Int32Array): Promise<number> | null {
  const a = loadedAddon();
  if (!a || typeof a.writeNativeBlock !== 'function') return null;
  return callAsync(() => a.writeNativeBlock!(path, payload, rows, layout, heads, headEnds, keys));
}
