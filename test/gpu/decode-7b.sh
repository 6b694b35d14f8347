#!/usr/bin/env bash
# Issue #52 items 3 and 4 on one GPU, in one call (after `bash test/gpu/pack-node.sh build DIR`): decode at
# Qwen2.5-7B's shape against transformers and the bandwidth bound, and the main job's GPU busy share.
#   bash test/gpu/decode-7b.sh ours OUTDIR       # generate-bench.ts --shape 7b, 2k contexts, batches 1/64/256
#                                                # (ENGINE_ARGS='--engine off': the decode loop only)
#   bash test/gpu/decode-7b.sh profile OUTDIR    # the same model's step by kernel kind (synchronised, no graphs)
#   bash test/gpu/decode-7b.sh hf OUTDIR [S]     # generate_hf.py --shape 7b, cases begun within S s (default 110)
#   bash test/gpu/decode-7b.sh busy OUTDIR NAME [DIR] [ARGS…]  # gpu_busy.py around `rlstream run config.gpu.yaml
#                                                # --set backend.device=cuda ARGS…` (NVML utilization every 100 ms)
# Durations seen on one H200 (RESULTS.md, 2026-11-29): the 7B model's init 95 s in each of ours/profile, `ours`
# about 4 minutes in all, `hf` about a minute a compiled batch size plus the eager cases; `busy` 10 s a run.
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:?usage: decode-7b.sh ours|profile|hf|busy OUTDIR}
out=${2:?OUTDIR}
mkdir -p "$out"
home=${RLSTREAM_NODE_HOME:-/tmp/rlstream-node}
node=$home/bin/node
export LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # the addon's OpenBLAS, as pack-node.sh's use
common=(--shape 7b --context 2048 --steps 32)
case "$what" in
  ours) "$node" --import tsx test/gpu/generate-bench.ts "${common[@]}" --batches 1,64,256 ${ENGINE_ARGS:---engine-batches 1,64} | tee -a "$out/ours7b.jsonl" ;;
  profile)
    RLSTREAM_CUDA_SYNC=1 RLSTREAM_CUDA_GRAPHS=0 "$node" --import tsx test/gpu/generate-bench.ts --shape 7b --context 2048 --steps 3 \
      --batches 1,64 --engine off | tee -a "$out/profile7b.jsonl" ;;
  hf)
    PYTHONUNBUFFERED=1 python3 test/gpu/generate_hf.py "${common[@]}" --order auto:64,eager:64,eager:1,eager:256,auto:1,auto:256 \
      --deadline-s "${3:-110}" | tee -a "$out/hf7b.jsonl" ;;
  busy)
    name=${3:?NAME}
    dir=${4:-.node-pack}
    shift 4 || shift $#
    python3 test/gpu/gpu_busy.py --out "$out/$name" -- bash test/gpu/pack-node.sh run "$dir" examples/calculator/config.gpu.yaml \
      --set backend.device=cuda "$@" | tee -a "$out/busy.jsonl" ;;
  *) echo "usage: $0 ours|profile|hf|busy OUTDIR" >&2; exit 2 ;;
esac
