// A small builder for ONNX graphs encoded with onnx-proto: named nodes, typed inputs/outputs with symbolic
// dimensions, and initializers carried as raw little-endian bytes.
import onnxProto from 'onnx-proto';

const { onnx } = onnxProto;

export type Dim = number | string;

const FLOAT = 1;
const INT64 = 7;

export class GraphBuilder {
  private readonly nodes: onnxProto.onnx.INodeProto[] = [];
  private readonly initializers: onnxProto.onnx.ITensorProto[] = [];
  private readonly inputs: onnxProto.onnx.IValueInfoProto[] = [];
  private readonly outputs: onnxProto.onnx.IValueInfoProto[] = [];
  private readonly consts = new Map<string, string>();
  private counter = 0;

  private fresh(prefix: string): string {
    return `${prefix}_${this.counter++}`;
  }

  private valueInfo(name: string, elemType: number, dims: Dim[]): onnxProto.onnx.IValueInfoProto {
    return {
      name,
      type: { tensorType: { elemType, shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } },
    };
  }

  input(name: string, type: 'float' | 'int64', dims: Dim[]): string {
    this.inputs.push(this.valueInfo(name, type === 'float' ? FLOAT : INT64, dims));
    return name;
  }

  output(name: string, dims: Dim[]): void {
    this.outputs.push(this.valueInfo(name, FLOAT, dims));
  }

  /** A float initializer; `data` is referenced, not copied, until encode(). */
  weight(name: string, dims: number[], data: Float32Array): string {
    this.initializers.push({ name, dims, dataType: FLOAT, rawData: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) });
    return name;
  }

  /** An int64 constant (shapes, axes, indices), shared between nodes that use the same values. */
  ints(values: number[]): string {
    const key = values.join(',');
    const known = this.consts.get(key);
    if (known) return known;
    const name = this.fresh('const_i64');
    const data = BigInt64Array.from(values.map((v) => BigInt(v)));
    this.initializers.push({ name, dims: [values.length], dataType: INT64, rawData: new Uint8Array(data.buffer) });
    this.consts.set(key, name);
    return name;
  }

  /** A float scalar constant. */
  scalar(value: number): string {
    const key = `f:${value}`;
    const known = this.consts.get(key);
    if (known) return known;
    const name = this.fresh('const_f32');
    this.initializers.push({ name, dims: [], dataType: FLOAT, rawData: new Uint8Array(new Float32Array([value]).buffer) });
    this.consts.set(key, name);
    return name;
  }

  /**
   * Add a node; returns its output name (`out` when given, e.g. a graph output, else a fresh one).
   * Attributes: numbers that are integers become INT, other numbers FLOAT, arrays of integers INTS.
   */
  op(opType: string, inputs: string[], attrs: Record<string, number | number[]> = {}, out?: string): string {
    return this.ops(opType, inputs, attrs, [out ?? this.fresh(opType.toLowerCase())])[0]!;
  }

  /** A node with several outputs (e.g. Split), named `outputs`; returns them. */
  ops(opType: string, inputs: string[], attrs: Record<string, number | number[]>, outputs: string[]): string[] {
    const attribute: onnxProto.onnx.IAttributeProto[] = Object.entries(attrs).map(([name, v]) => {
      if (Array.isArray(v)) return { name, type: onnx.AttributeProto.AttributeType.INTS, ints: v };
      if (Number.isInteger(v)) return { name, type: onnx.AttributeProto.AttributeType.INT, i: v };
      return { name, type: onnx.AttributeProto.AttributeType.FLOAT, f: v };
    });
    this.nodes.push({ opType, input: inputs, output: outputs, name: this.fresh(`n_${opType}`), attribute });
    return outputs;
  }

  encode(graphName: string, opset: number): Uint8Array {
    const model: onnxProto.onnx.IModelProto = {
      irVersion: 8,
      producerName: 'rlstream',
      opsetImport: [{ domain: '', version: opset }],
      graph: { name: graphName, node: this.nodes, initializer: this.initializers, input: this.inputs, output: this.outputs },
    };
    return onnx.ModelProto.encode(model).finish();
  }
}
