#!/usr/bin/env bash
# Decode speed of the native core before (RLSTREAM_CUDA_GRAPHS=0 RLSTREAM_CUDA_FUSED=0), with the fused decode ops
# alone (RLSTREAM_CUDA_GRAPHS=0) and with both (the default), both shapes,
# then transformers' static-cache generate (eager and compiled) on the same machine: the figures of RESULTS.md's
# section "Decode as CUDA graphs". Run on the GPU machine after `bash test/gpu/pack-node.sh build`.
#   bash test/gpu/decode-graphs.sh ours [OUTDIR]   # generate-bench.ts, 135m and 500m, before / fused / graphs
#   bash test/gpu/decode-graphs.sh hf [OUTDIR]     # generate_hf.py, 135m and 500m
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-ours}
out=${2:-/tmp/decode-graphs}
mkdir -p "$out"
home=${RLSTREAM_NODE_HOME:-/tmp/rlstream-node}
node=$home/bin/node
export LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # the addon's OpenBLAS, as pack-node.sh's use
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$out/card.txt"
case "$what" in
  ours)
    # before: the plain ops launched one by one; fused: the fused decode ops, launched; graphs: fused, as graphs
    for shape in 135m 500m; do
      for mode in before fused graphs; do
        case $mode in
          before) env=(RLSTREAM_CUDA_GRAPHS=0 RLSTREAM_CUDA_FUSED=0) ;;
          fused) env=(RLSTREAM_CUDA_GRAPHS=0 RLSTREAM_CUDA_FUSED=1) ;;
          graphs) env=(RLSTREAM_CUDA_GRAPHS=${GRAPHS_MODE:-1} RLSTREAM_CUDA_FUSED=1) ;;  # GRAPHS_MODE=2 logs captures
        esac
        echo "== ours shape=$shape ${env[*]}"
        env "${env[@]}" "$node" --import tsx test/gpu/generate-bench.ts --shape "$shape" | sed "s/^{/{\"mode\":\"$mode\",/" | tee -a "$out/ours.jsonl"
      done
    done
    ;;
  hf)
    for shape in 135m 500m; do
      echo "== transformers shape=$shape"
      PYTHONUNBUFFERED=1 python3 test/gpu/generate_hf.py --shape "$shape" | tee -a "$out/hf.jsonl"
    done
    ;;
  *) echo "usage: $0 ours|hf [OUTDIR]" >&2; exit 2 ;;
esac
