#!/usr/bin/env bash
# Issue #53 on a machine with two or more GPUs: rollout engines on a GPU of their own (backend.devices), each version
# broadcast from the trainer's GPU over NCCL.
#   here:  bash test/gpu/main-7b.sh tokenizer        # .decodecarry/qwen3-tok.tar.xz (there: tar -xJf; TOKDIR its qwen3-tok)
#   there: bash test/gpu/pack-node.sh build DIR      # the node pack
#          bash test/gpu/engines.sh model TOKDIR [MODELDIR]    # Qwen2.5-1.5B's shape, random bf16 weights
#                                                             # (default .rlstream/models/qwen1.5b-random)
#          bash test/gpu/engines.sh bench OUTDIR [--shape S]   # a version to the engine: broadcast against its file
#          bash test/gpu/engines.sh run OUTDIR [MODELDIR] [ARGS…]
#                # the main job (test/gpu/config.engines.yaml) with trainer and rollouts on GPU 0, then with the
#                # rollouts on GPU 1, each with every GPU's busy share (gpu_busy.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:?usage: engines.sh model|bench|run}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "$what" in
  model)
    tok=${2:?TOKDIR}
    dir=${3:-.rlstream/models/qwen1.5b-random}
    rm -rf "$dir"
    PYTHONUNBUFFERED=1 python3 test/gpu/make_model_7b.py --out "$dir" --tokenizer "$tok" --shape 1.5B ;;
  bench)
    out=${2:?OUTDIR}
    shift 2
    mkdir -p "$out"
    home=${RLSTREAM_NODE_HOME:-/tmp/rlstream-node}
    export PATH="$home/bin:$PATH" LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ -e node_modules ] || ln -s "$home/node_modules" node_modules
    node --import tsx test/gpu/engines-bench.ts "$@" | tee -a "$out/engines-bench.jsonl" ;;
  run)
    out=${2:?OUTDIR}
    dir=$(realpath -m "${3:-.rlstream/models/qwen1.5b-random}")
    shift 3 || shift $#
    mkdir -p "$out"
    set_model=(--set model.base="$dir" --set model.config="$dir/config.json" --set model.tokenizer="$dir" --set model.init="$dir")
    for shape in one-gpu engines-gpu1; do
      extra=()
      [ "$shape" = engines-gpu1 ] && extra=(--set 'backend.devices=[1]')
      python3 test/gpu/gpu_busy.py --out "$out/$shape" -- bash test/gpu/pack-node.sh run - test/gpu/config.engines.yaml \
        "${set_model[@]}" "${extra[@]}" --new --no-admin "$@" | sed "s/^/$shape /" | tee -a "$out/engines-run.jsonl"
    done ;;
  *) echo "usage: $0 model|bench|run" >&2; exit 2 ;;
esac
