// A RecordChunk of the embedded log: whole, CRC-checked frames of one partition back to back in one buffer. Only
// this folder knows the frame format (record-format.ts); a reader of chunks asks the chunk where each value lies.
import type { LogRecord, RecordChunk } from '../types.ts';
import { copiedRecord, readRecordAt, valueStartAt } from './record-format.ts';

export class FrameChunk implements RecordChunk {
  readonly count: number;
  private readonly view: DataView;

  constructor(
    readonly topic: string,
    readonly partition: number,
    readonly firstOffset: number,
    readonly buf: Buffer,
    /** Where each record's frame starts in buf, in offset order. */
    readonly starts: Int32Array,
  ) {
    this.count = starts.length;
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.length);
  }

  valueStart(i: number): number {
    return valueStartAt(this.view, this.starts[i]!);
  }

  valueLength(i: number): number {
    // The value's length is the u32 just before it.
    return this.view.getUint32(this.valueStart(i) - 4);
  }

  /** Record i with views into buf (valid until the chunk is released): the embedded consumer's poll. */
  recordInPlace(i: number): LogRecord {
    return readRecordAt(this.view, this.buf, this.starts[i]!, this.topic, this.partition);
  }

  record(i: number): LogRecord {
    return copiedRecord(this.recordInPlace(i));
  }

  head(count: number): RecordChunk {
    return count >= this.count ? this : new FrameChunk(this.topic, this.partition, this.firstOffset, this.buf, this.starts.subarray(0, Math.max(0, count)));
  }
}
