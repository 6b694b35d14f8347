#!/usr/bin/env bash
# The native core's NCCL layer on a GPU machine, without Node: builds test/gpu/nccl_driver.cpp with
# native/src/nccl_core.cpp against the CUDA runtime (g++ only; NCCL's headers are not needed), finds libnccl.so.2
# (RLSTREAM_NCCL_LIBRARY, the loader's path, or pip's nvidia-nccl-cu12 under python3), and runs the driver, then
# runs it again pointed at a library that is not NCCL to show the refusal. Writes $OUT/nccl.json. Without nvcc's
# CUDA runtime or a GPU it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
gpu_script=test/gpu/nccl.sh gpu_build=/tmp/rlstream-nccl-build
source test/gpu/env.sh
g++ -O2 -std=c++17 -DRLSTREAM_CUDA -I"$CUDA_HOME/include" native/src/nccl_core.cpp test/gpu/nccl_driver.cpp \
  "${cuda_link[@]}" -lcudart -ldl -o "$B/nccl_driver" || exit 1
lib=$(find_nccl)
echo "libnccl.so.2: ${lib:-found by the dynamic loader}"
RLSTREAM_NCCL_LIBRARY=$lib "$B/nccl_driver" | tee "$OUT/nccl.json"
status=${PIPESTATUS[0]}
# a library that is not NCCL: refused, naming the missing symbol
RLSTREAM_NCCL_LIBRARY=$(ldconfig -p | awk '/libz.so.1 /{print $NF; exit}') "$B/nccl_driver" | tee "$OUT/nccl-not-nccl.json"
exit "$status"
