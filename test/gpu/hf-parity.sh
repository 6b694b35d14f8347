#!/usr/bin/env bash
# rlstream against Hugging Face transformers on model directories of each family (llama with Llama 3.1's rope
# scaling, qwen2, qwen3, mistral), on a GPU machine with transformers and no Node: transformers writes the random
# models as sharded directories (test/gpu/hf_parity.py make), rlstream loads them on the CPU and on CUDA and exports
# a trained step (test/gpu/hf-parity.ts), transformers loads the export back and both are compared
# (hf_parity.py compare): $OUT/parity.json, the table of docs/models.md.
#   bash test/gpu/hf-parity.sh            # after `bash test/gpu/pack-node.sh build` (the addon with RLSTREAM_CUDA=1)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rlstream-hf-parity}
home=${RLSTREAM_NODE_HOME:-/tmp/rlstream-node}
work=${HF_PARITY_DIR:-/tmp/hf-parity}
export PATH="$home/bin:$PATH" LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
[ -e node_modules ] || ln -s "$home/node_modules" node_modules
rm -rf "$work" && mkdir -p "$work" "$OUT"
python3 test/gpu/hf_parity.py make "$work"
node --import tsx test/gpu/hf-parity.ts "$work" cpu,cuda
status=0
python3 test/gpu/hf_parity.py compare "$work" >"$OUT/parity-stdout.json" || status=$?
cp "$work/parity.json" "$OUT/parity.json"
exit $status
