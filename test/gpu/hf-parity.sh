#!/usr/bin/env bash
# rlstream against Hugging Face transformers on model directories of each family (llama with Llama 3.1's rope
# scaling, qwen2, qwen3, mistral; each with a tied and an untied head) and on SmolLM2-135M-Instruct: transformers
# writes the random models as sharded directories (test/gpu/hf_parity.py make), `rlstream import gguf`'s importer
# writes SmolLM2's (f32, and bf16 with --dtype bf16), rlstream loads them on the CPU and on CUDA and exports a trained
# step (test/gpu/hf-parity.ts), transformers loads the export back and both are compared (hf_parity.py compare):
# $OUT/parity.json and parity.md, the table of docs/models.md.
#   bash test/gpu/hf-parity.sh [NAMES]     # after `bash test/gpu/pack-node.sh build` (the addon with RLSTREAM_CUDA=1)
# NAMES: comma-separated, default the eight random variants; `smollm2` needs the GGUF at $SMOLLM2_GGUF (default
# $RLSTREAM_NODE_HOME/model.gguf, where `bash test/gpu/smollm2.sh assemble` puts it). A later call on the same
# machine adds its names to the earlier ones' results ($HF_PARITY_DIR is kept; HF_PARITY_FRESH=1 starts over).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rlstream-hf-parity}
home=${RLSTREAM_NODE_HOME:-/tmp/rlstream-node}
work=${HF_PARITY_DIR:-/tmp/hf-parity}
names=${1:-llama,qwen2,qwen3,mistral,llama-tied,qwen2-untied,qwen3-untied,mistral-tied}
export PATH="$home/bin:$PATH" LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
[ -e node_modules ] || ln -s "$home/node_modules" node_modules
[ "${HF_PARITY_FRESH:-0}" = 1 ] && rm -rf "$work"
mkdir -p "$work" "$OUT"
if [[ ",$names," == *,smollm2,* ]]; then
  gguf=${SMOLLM2_GGUF:-$home/model.gguf}
  [ -f "$gguf" ] || { echo "hf-parity: no $gguf (bash test/gpu/smollm2.sh assemble)" >&2; exit 1; }
  # = rlstream import gguf <gguf> --out DIR [--dtype bf16], through the importer itself (the CLI loads every
  # command's npm modules, which the node pack leaves out)
  for dtype in F32 BF16; do
    d="$work/smollm2$([ $dtype = BF16 ] && echo -bf16 || true)"
    rm -rf "$d"
    node --import tsx -e "import { importGguf } from './core/weights/gguf-import.ts'; const t = Date.now(); const s = await importGguf(process.argv[1], process.argv[2], { dtype: process.argv[3] }); console.log('import', process.argv[3], JSON.stringify(s), (Date.now() - t) / 1000, 's');" "$gguf" "$d" "$dtype"
  done
fi
python3 test/gpu/hf_parity.py make "$work" "$names"
node --import tsx test/gpu/hf-parity.ts "$work" cpu,cuda "$names"
status=0
python3 test/gpu/hf_parity.py compare "$work" >"$OUT/parity-stdout.json" || status=$?
cp "$work/parity.json" "$work/parity.md" "$OUT/"
exit $status
