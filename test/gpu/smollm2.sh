#!/usr/bin/env bash
# SmolLM2-135M-Instruct learning the calculator task on a GPU machine that has no Node and no network, and takes
# at most 64 MiB per call: the 98 MB GGUF travels in two parts over consecutive calls, is imported there by
# `rlstream import gguf`, and examples/calculator/config.smollm2.yaml runs on it (test/gpu/RESULTS.md).
#   bash test/gpu/smollm2.sh split [GGUF]       # here: .rlstream/gguf-parts/part-aa, part-ab and SHA256SUMS
#   (call 1) bash test/gpu/pack-node.sh build   # with carry .node-pack (pack-node.sh pack-run here first)
#   (call 2) bash test/gpu/smollm2.sh receive   # with carry .rlstream/gguf-parts/part-aa
#   (call 3) bash test/gpu/smollm2.sh receive && bash test/gpu/smollm2.sh import
#                                               # with carry .rlstream/gguf-parts/part-ab and SHA256SUMS
#   bash test/gpu/smollm2.sh run SEED [ARGS…]    # there: the main job, its JSON line and GPU utilization under $OUT
#                                               # (SMOLLM2_CONFIG=examples/calculator/config.lora.yaml: with LoRA)
# `receive DIR` takes the parts from DIR instead (any number, part-aa, part-ab, part-ac, … in name order, made by
# `split N`); `assemble` only joins and checks them into $RLSTREAM_NODE_HOME/model.gguf (what
# test/gpu/hf-parity.sh smollm2 imports).
# Consecutive calls find the same machine only while it is held (it goes back after a short idle time).
set -euo pipefail
cd "$(dirname "$0")/../.."
step=${1:-}
home=${RLSTREAM_NODE_HOME:-/tmp/rlstream-node}
parts=.rlstream/gguf-parts
kept="$home/gguf-parts"
model_dir=.rlstream/models/smollm2
config=${SMOLLM2_CONFIG:-examples/calculator/config.smollm2.yaml}  # config.lora.yaml: the same with LoRA

case "$step" in
  split)
    gguf=${2:-.infra/llama.cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    n=${3:-2}
    [ -f "$gguf" ] || { echo "split: no $gguf (bash infra/setup.sh downloads it)" >&2; exit 1; }
    rm -rf "$parts" && mkdir -p "$parts"
    split -n "$n" -a 2 "$gguf" "$parts/part-"
    (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | awk '{print $1}' >"$parts/SHA256SUMS"
    ls -l "$parts"
    ;;
  receive)
    mkdir -p "$kept"
    for f in "${2:-$parts}"/part-* "${2:-$parts}"/SHA256SUMS; do [ -f "$f" ] && cp "$f" "$kept/"; done
    ls -l "$kept"
    ;;
  assemble | import)
    [ -f "$kept/part-aa" ] && [ -f "$kept/SHA256SUMS" ] || { echo "$step: parts missing in $kept (receive them first)" >&2; exit 1; }
    cat "$kept"/part-* >"$home/model.gguf"
    [ "$(sha256sum "$home/model.gguf" | awk '{print $1}')" = "$(cat "$kept/SHA256SUMS")" ] || { echo "$step: checksum differs (a part missing?)" >&2; exit 1; }
    if [ "$step" = import ]; then bash test/gpu/pack-node.sh cli .node-pack import gguf "$home/model.gguf" --out "$model_dir"; fi
    ;;
  run)
    seed=${2:?run SEED}
    shift 2
    out=${OUT:-/tmp/smollm2-out}
    mkdir -p "$out"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 >"$out/gpu-seed$seed.csv" &
    smi=$!
    rc=0
    bash test/gpu/pack-node.sh run .node-pack "$config" --new --set run.seed="$seed" "$@" >"$out/run-seed$seed.json" 2>"$out/run-seed$seed.err" || rc=$?
    kill "$smi" 2>/dev/null || true
    tail -c 3000 "$out/run-seed$seed.err" | grep -v '^\s*$' | tail -5
    cat "$out/run-seed$seed.json"
    awk -F', ' '{n++; u+=$1; if ($1>0) b++; if ($2>m) m=$2} END {if (n) printf "gpu: %d samples, utilization %.1f%% mean, non-zero %.0f%%, max %d MiB\n", n, u/n, 100*b/n, m}' "$out/gpu-seed$seed.csv"
    exit "$rc"
    ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
