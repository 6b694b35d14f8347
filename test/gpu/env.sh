# Sourced by the GPU scripts that build with the CUDA toolkit (run.sh, nccl.sh): where their outputs and builds go,
# the skip on a machine without nvcc or a GPU (the script exits 0, saying so), the toolkit's root, and the linker
# flags for its runtime libraries. The script sets gpu_script (its name) and gpu_build (its default build directory)
# first.
OUT=${OUT:-/tmp/rlstream-gpu}
B=${RLSTREAM_GPU_BUILD:-$gpu_build}
mkdir -p "$OUT" "$B"
if ! command -v nvcc >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "$gpu_script: skipped (needs the CUDA toolkit and an NVIDIA GPU)"
  exit 0
fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
# The runtime libraries sit in lib64 (Debian, NVIDIA's installers), lib, or targets/x86_64-linux/lib (conda, pip).
cuda_link=(-L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" -L"$CUDA_HOME/targets/x86_64-linux/lib" -Wl,-rpath,"$CUDA_HOME/lib64")
