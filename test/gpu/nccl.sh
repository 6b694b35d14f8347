#!/usr/bin/env bash
# The native core's NCCL layer on a GPU machine, without Node: builds test/gpu/nccl_driver.cpp with
# native/src/nccl_core.cpp against the CUDA runtime (g++ only; NCCL's headers are not needed), finds libnccl.so.2
# (RLSTREAM_NCCL_LIBRARY, the loader's path, or pip's nvidia-nccl-cu12 under python3), and runs the driver, then
# runs it again pointed at a library that is not NCCL to show the refusal. Writes $OUT/nccl.json. Without nvcc's
# CUDA runtime or a GPU it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rlstream-gpu}
B=${RLSTREAM_GPU_BUILD:-/tmp/rlstream-nccl-build}
mkdir -p "$OUT" "$B"
if ! command -v nvcc >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test/gpu/nccl.sh: skipped (needs the CUDA toolkit and an NVIDIA GPU)"
  exit 0
fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
g++ -O2 -std=c++17 -DRLSTREAM_CUDA -I"$CUDA_HOME/include" native/src/nccl_core.cpp test/gpu/nccl_driver.cpp \
  -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" -L"$CUDA_HOME/targets/x86_64-linux/lib" -lcudart -ldl \
  -Wl,-rpath,"$CUDA_HOME/lib64" -o "$B/nccl_driver" || exit 1
lib=${RLSTREAM_NCCL_LIBRARY:-}
if [ -z "$lib" ] && ! ldconfig -p | grep -q 'libnccl.so.2 '; then
  # pip's nvidia-nccl-cu12/-cu13 (PyTorch's NCCL) under python3's site-packages
  sp=$(python3 -c 'import site; print(chr(10).join(site.getsitepackages()))' 2>/dev/null || true)
  lib=$(echo "$sp" | while read -r d; do [ -d "$d" ] && find "$d" -name libnccl.so.2 2>/dev/null; done | head -1)
fi
echo "libnccl.so.2: ${lib:-found by the dynamic loader}"
RLSTREAM_NCCL_LIBRARY=$lib NCCL_NVLS_ENABLE=0 "$B/nccl_driver" | tee "$OUT/nccl.json"
status=${PIPESTATUS[0]}
# a library that is not NCCL: refused, naming the missing symbol
RLSTREAM_NCCL_LIBRARY=$(ldconfig -p | awk '/libz.so.1 /{print $NF; exit}') "$B/nccl_driver" | tee "$OUT/nccl-not-nccl.json"
exit "$status"
