"""Random blocks of every GGUF type the reader dequantizes, written by gguf-py (llama.cpp's Python package),
with gguf-py's dequantization of them, for test/import/quant_parity.ts:

  python test/import/quant_parity.py <dir>     # writes <dir>/blocks.gguf and <dir>/expected.json
  npx tsx test/import/quant_parity.ts <dir>    # max abs difference per type

Needs: pip install gguf numpy. The f16 scale fields get random finite values in [-2, 2]; all other bytes are random.
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter, dequantize
from gguf.constants import GGML_QUANT_SIZES

HALF_FIELDS = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q4_K: [0, 2], T.Q6_K: [208]}


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(0)
    w = GGUFWriter(f"{out}/blocks.gguf", "llama")
    expected = {}
    for t in [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K]:
        _, block_bytes = GGML_QUANT_SIZES[t]
        n = 160
        if t == T.F16:
            raw = np.frombuffer(rng.uniform(-4, 4, n).astype(np.float16).tobytes(), np.uint8)
        elif t == T.BF16:
            raw = np.frombuffer((rng.uniform(-4, 4, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes(), np.uint8)
        else:
            raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
            for off in HALF_FIELDS[t]:
                raw[:, off:off + 2] = np.frombuffer(rng.uniform(-2, 2, n).astype(np.float16).tobytes(), np.uint8).reshape(n, 2)
        raw = raw.reshape(4, -1)
        w.add_tensor(t.name, raw, raw_dtype=t)
        expected[t.name] = dequantize(raw, t).astype(np.float32).reshape(-1).tolist()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    json.dump(expected, open(f"{out}/expected.json", "w"))


if __name__ == "__main__":
    main()
